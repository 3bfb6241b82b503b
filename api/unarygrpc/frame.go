package unarygrpc

import (
	"encoding/binary"
	"fmt"
	"io"
)

// HTTP/2 frame types (RFC 9113, section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9
)

// Frame flags.
const (
	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

// SETTINGS parameters.
const (
	settingHeaderTableSize   = 0x1
	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5
)

const (
	// preface is what a client sends first on an HTTP/2 connection.
	preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// defaultWindow is a new stream's and connection's flow-control window.
	defaultWindow = 65535
	// defaultMaxFrame is the largest frame payload a peer accepts until
	// its SETTINGS say otherwise.
	defaultMaxFrame = 16384
	// maxFrameLimit is the largest SETTINGS_MAX_FRAME_SIZE allowed.
	maxFrameLimit = 1<<24 - 1
	// maxWindow is the largest flow-control window allowed.
	maxWindow = 1<<31 - 1
	// ourWindow is the window this client gives the server, per stream
	// and for the connection: replies up to this size need no
	// WINDOW_UPDATE; larger ones are read in pieces.
	ourWindow = 1 << 20
	// ourMaxFrame is the largest frame payload this client accepts.
	ourMaxFrame = 1 << 20
)

// frame is one HTTP/2 frame read from the server; payload is only valid
// until the next read.
type frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

// readFrame reads one frame into buf (grown as needed) and returns it.
func readFrame(r io.Reader, buf *[]byte) (frame, error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if n > ourMaxFrame {
		return frame{}, fmt.Errorf("frame of %d bytes exceeds the %d announced", n, ourMaxFrame)
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	p := (*buf)[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		return frame{}, err
	}
	return frame{typ: h[3], flags: h[4], stream: binary.BigEndian.Uint32(h[5:9]) & 0x7fffffff, payload: p}, nil
}

// appendFrame appends a frame with payload p to b.
func appendFrame(b []byte, typ, flags byte, stream uint32, p []byte) []byte {
	n := len(p)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, p...)
}

// appendWindowUpdate appends a WINDOW_UPDATE of n bytes for stream (0: the
// connection).
func appendWindowUpdate(b []byte, stream uint32, n uint32) []byte {
	return appendFrame(b, frameWindowUpdate, 0, stream, binary.BigEndian.AppendUint32(nil, n))
}

// unpad strips the padding of a DATA or HEADERS frame with flagPadded.
func unpad(f frame) ([]byte, error) {
	p := f.payload
	if f.flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, fmt.Errorf("frame type %d: bad padding", f.typ)
	}
	return p[1 : len(p)-int(p[0])], nil
}
