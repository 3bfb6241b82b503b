package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// peerCreds are gRPC transport credentials for a unix socket: the handshake
// reads the connecting process's SO_PEERCRED (uid, gid, pid) and hands it to
// the call as AuthInfo. No encryption: the socket's file mode and the uid
// check below are the protection.
type peerCreds struct{}

// PeerInfo is the AuthInfo of a call on the unix socket.
type PeerInfo struct {
	credentials.CommonAuthInfo
	Uid, Gid uint32
	Pid      int32
}

func (PeerInfo) AuthType() string { return "peercred" }

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("peercred: %T is not a unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, nil, err
	}
	if serr != nil {
		return nil, nil, fmt.Errorf("peercred: %w", serr)
	}
	return c, PeerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, Uid: cred.Uid, Gid: cred.Gid, Pid: cred.Pid}, nil
}

func (peerCreds) ClientHandshake(ctx context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("peercred: server-side only")
}
func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }

// peerUID returns the caller's uid as a string ("unknown" if absent).
func peerUID(ctx context.Context) (uint32, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return 0, false
	}
	info, ok := p.AuthInfo.(PeerInfo)
	if !ok {
		return 0, false
	}
	return info.Uid, true
}

func uidLabel(ctx context.Context) string {
	if uid, ok := peerUID(ctx); ok {
		return strconv.FormatUint(uint64(uid), 10)
	}
	return "unknown"
}

// authorize admits a call only from an allowed uid; health checks too, since
// the socket is the daemon's only door.
func authorize(allowed *uidSet) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		uid, ok := peerUID(ctx)
		if !ok {
			return nil, status.Error(codes.PermissionDenied, "caller credentials unknown")
		}
		if !allowed.allows(uid) {
			return nil, status.Errorf(codes.PermissionDenied, "uid %d may not call %s (allowed: --allow-uid)", uid, info.FullMethod)
		}
		return handler(ctx, req)
	}
}
