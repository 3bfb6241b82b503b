package tcfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal eBPF assembler with labels for the few instructions the echo
// programs need (bpfInsn, bpf.go), maps and program loading with the
// verifier's log, through the bpf(2) syscall. See echo.go.

const (
	r0, r1, r2, r3, r4, r6, r7, r8, r9, r10 = 0, 1, 2, 3, 4, 6, 7, 8, 9, 10

	opMovImm   = 0xb7 // ALU64 MOV K
	opMovReg   = 0xbf // ALU64 MOV X
	opAddImm   = 0x07 // ALU64 ADD K
	opAndImm32 = 0x54 // ALU32 AND K
	opLdxB     = 0x71
	opLdxW     = 0x61
	opStxB     = 0x73
	opStxW     = 0x63
	opStW      = 0x62 // ST MEM W (imm)
	opJeq32    = 0x16 // JMP32 JEQ K
	opJne32    = 0x56 // JMP32 JNE K
	opJeqImm   = 0x15 // JMP JEQ K (64-bit)
	opJeqReg   = 0x1d // JMP JEQ X (64-bit)
	opJeq32Reg = 0x1e // JMP32 JEQ X
	opJgeReg   = 0x3d // JMP JGE X (64-bit, unsigned)
	opJsgeReg  = 0x7d // JMP JSGE X (64-bit, signed)
	opSubReg   = 0x1f // ALU64 SUB X
	opRshImm   = 0x77 // ALU64 RSH K
	opLdxDW    = 0x79
	opStxDW    = 0x7b
	opStDW     = 0x7a // ST MEM DW (imm, sign-extended)
	opJa       = 0x05
	opCall     = 0x85
	opExit     = 0x95
	opLdImm64  = 0x18

	helperMapLookup  = 1
	helperMapUpdate  = 2
	helperKtimeGetNs = 5
	helperRedirect   = 23
	helperLoadBytes  = 26
)

// asm assembles a program with forward jumps to labels.
type asm struct {
	insns  []bpfInsn
	labels map[string]int
	fixups map[int]string // insn index -> label
}

func newAsm() *asm { return &asm{labels: map[string]int{}, fixups: map[int]string{}} }

func (a *asm) emit(code uint8, dst, src uint8, off int16, imm int32) {
	a.insns = append(a.insns, bpfInsn{code: code, regs: dst | src<<4, off: off, imm: imm})
}

func (a *asm) movImm(dst uint8, imm int32) { a.emit(opMovImm, dst, 0, 0, imm) }
func (a *asm) movReg(dst, src uint8)       { a.emit(opMovReg, dst, src, 0, 0) }
func (a *asm) addImm(dst uint8, imm int32) { a.emit(opAddImm, dst, 0, 0, imm) }
func (a *asm) ldxB(dst, src uint8, off int16) {
	a.emit(opLdxB, dst, src, off, 0)
}
func (a *asm) ldxW(dst, src uint8, off int16) { a.emit(opLdxW, dst, src, off, 0) }
func (a *asm) stxB(dst, src uint8, off int16) { a.emit(opStxB, dst, src, off, 0) }
func (a *asm) stxW(dst, src uint8, off int16) { a.emit(opStxW, dst, src, off, 0) }
func (a *asm) stW(dst uint8, off int16, imm int32) {
	a.emit(opStW, dst, 0, off, imm)
}
func (a *asm) call(helper int32) { a.emit(opCall, 0, 0, 0, helper) }
func (a *asm) exit()             { a.emit(opExit, 0, 0, 0, 0) }

// jmp emits a conditional (or, with op opJa, unconditional) jump to label.
func (a *asm) jmp(op uint8, reg uint8, imm int32, label string) {
	a.fixups[len(a.insns)] = label
	a.emit(op, reg, 0, 0, imm)
}

func (a *asm) label(name string) { a.labels[name] = len(a.insns) }

// jmpReg emits a conditional jump comparing registers dst and src.
func (a *asm) jmpReg(op uint8, dst, src uint8, label string) {
	a.fixups[len(a.insns)] = label
	a.emit(op, dst, src, 0, 0)
}

func (a *asm) ldxDW(dst, src uint8, off int16) { a.emit(opLdxDW, dst, src, off, 0) }
func (a *asm) stxDW(dst, src uint8, off int16) { a.emit(opStxDW, dst, src, off, 0) }

// ldImm64 loads a 64-bit constant into dst (a two-slot instruction).
func (a *asm) ldImm64(dst uint8, v uint64) {
	a.emit(opLdImm64, dst, 0, 0, int32(uint32(v)))
	a.emit(0, 0, 0, 0, int32(uint32(v>>32)))
}

// ldMap loads a map's fd into dst (a two-slot instruction).
func (a *asm) ldMap(dst uint8, fd int) {
	a.emit(opLdImm64, dst, unix.BPF_PSEUDO_MAP_FD, 0, int32(fd))
	a.emit(0, 0, 0, 0, 0)
}

// copyBytes copies n bytes between stack slots relative to r10, one byte
// at a time (byte accesses are always aligned for the verifier).
func (a *asm) copyBytes(dstOff, srcOff int16, n int) {
	for i := int16(0); i < int16(n); i++ {
		a.ldxB(r1, r10, srcOff+i)
		a.stxB(r10, r1, dstOff+i)
	}
}

func (a *asm) assemble() ([]byte, error) {
	for i, l := range a.fixups {
		t, ok := a.labels[l]
		if !ok {
			return nil, fmt.Errorf("bpf: undefined label %q", l)
		}
		a.insns[i].off = int16(t - i - 1)
	}
	out := make([]byte, 0, 8*len(a.insns))
	for _, in := range a.insns {
		var b [8]byte
		b[0], b[1] = in.code, in.regs
		binary.LittleEndian.PutUint16(b[2:], uint16(in.off))
		binary.LittleEndian.PutUint32(b[4:], uint32(in.imm))
		out = append(out, b[:]...)
	}
	return out, nil
}

func bpfSys(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// bpfMap is a map created by this process.
type bpfMap struct{ fd int }

func newBPFMap(typ, keySize, valueSize, maxEntries uint32, name string) (*bpfMap, error) {
	return newBPFMapFlags(typ, keySize, valueSize, maxEntries, 0, name)
}

// newBPFMapFlags is newBPFMap with map flags (BPF_F_*).
func newBPFMapFlags(typ, keySize, valueSize, maxEntries, flags uint32, name string) (*bpfMap, error) {
	attr := struct {
		mapType, keySize, valueSize, maxEntries, flags, innerFd, numaNode uint32
		name                                                              [16]byte
	}{mapType: typ, keySize: keySize, valueSize: valueSize, maxEntries: maxEntries, flags: flags}
	copy(attr.name[:15], name)
	fd, err := bpfSys(unix.BPF_MAP_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return nil, fmt.Errorf("bpf: create map %s: %w", name, err)
	}
	return &bpfMap{fd: fd}, nil
}

func (m *bpfMap) update(key, value []byte) error {
	return m.elem(unix.BPF_MAP_UPDATE_ELEM, key, value)
}

func (m *bpfMap) lookup(key, value []byte) error {
	return m.elem(unix.BPF_MAP_LOOKUP_ELEM, key, value)
}

// elem runs a map command that takes a key and a value.
func (m *bpfMap) elem(cmd int, key, value []byte) error {
	attr := struct {
		fd         uint32
		_          uint32
		key, value uint64
		flags      uint64
	}{fd: uint32(m.fd), key: uint64(uintptr(unsafe.Pointer(&key[0]))), value: uint64(uintptr(unsafe.Pointer(&value[0])))}
	_, err := bpfSys(cmd, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(key)
	runtime.KeepAlive(value)
	return err
}

func (m *bpfMap) delete(key []byte) error {
	attr := struct {
		fd  uint32
		_   uint32
		key uint64
	}{fd: uint32(m.fd), key: uint64(uintptr(unsafe.Pointer(&key[0])))}
	_, err := bpfSys(unix.BPF_MAP_DELETE_ELEM, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(key)
	return err
}

func (m *bpfMap) close() { unix.Close(m.fd) }

// loadSchedCls loads a tc classifier program and returns its fd.
func loadSchedCls(name string, code []byte) (int, error) {
	license := []byte("Apache-2.0\x00")
	logBuf := make([]byte, 64<<10)
	attr := struct {
		progType, insnCnt uint32
		insns, license    uint64
		logLevel, logSize uint32
		logBuf            uint64
		kernVersion       uint32
		progFlags         uint32
		name              [16]byte
	}{
		progType: unix.BPF_PROG_TYPE_SCHED_CLS, insnCnt: uint32(len(code) / 8),
		insns:    uint64(uintptr(unsafe.Pointer(&code[0]))),
		license:  uint64(uintptr(unsafe.Pointer(&license[0]))),
		logLevel: 1, logSize: uint32(len(logBuf)), logBuf: uint64(uintptr(unsafe.Pointer(&logBuf[0]))),
	}
	copy(attr.name[:15], name)
	var fd int
	var err error
	for try := 0; try < loadTries; try++ {
		// The verifier returns EAGAIN when a signal interrupts it; the Go
		// runtime's preemption signals do that now and then (seen once in
		// 1,000 setups). Any other error is final.
		if fd, err = bpfSys(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); !errors.Is(err, unix.EAGAIN) {
			break
		}
	}
	runtime.KeepAlive(code)
	runtime.KeepAlive(license)
	runtime.KeepAlive(logBuf)
	if err != nil {
		n := 0
		for n < len(logBuf) && logBuf[n] != 0 {
			n++
		}
		return 0, fmt.Errorf("bpf: load %s: %w: %s", name, err, logBuf[:n])
	}
	return fd, nil
}
