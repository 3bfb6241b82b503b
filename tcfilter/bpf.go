package tcfilter

// Two tiny cls_bpf programs (this kernel has no gact, so no "action drop";
// see "Drops" in the package documentation). They are loaded with the bpf
// syscall from hand-written instructions (no compiler, no library) and
// attached in direct-action mode, so their return value is the verdict.

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// bpfInsn is struct bpf_insn.
type bpfInsn struct {
	code uint8
	regs uint8 // dst (low 4 bits) | src (high 4 bits)
	off  int16
	imm  int32
}

// Instruction encodings used below.
const (
	bpfMovImm            = 0xb7 // BPF_ALU64 | BPF_MOV | BPF_K
	bpfExit              = 0x95 // BPF_JMP | BPF_EXIT
	bpfLdxW              = 0x61 // BPF_LDX | BPF_MEM | BPF_W
	bpfJeqImm            = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfMovReg            = 0xbf // BPF_ALU64 | BPF_MOV | BPF_X
	bpfAddImm            = 0x07 // BPF_ALU64 | BPF_ADD | BPF_K
	bpfStDW              = 0x7a // BPF_ST | BPF_MEM | BPF_DW
	bpfCall              = 0x85 // BPF_JMP | BPF_CALL
	bpfFuncSkbStoreBytes = 9
	skbVLANOff           = 20 // offsetof(struct __sk_buff, vlan_present)

	tcActUnspec = -1
	tcActOK     = 0
	tcActShot   = 2
)

// progShot drops every packet (TC_ACT_SHOT).
var progShot = []bpfInsn{
	{code: bpfMovImm, imm: tcActShot},
	{code: bpfExit},
}

// progNoVLAN marks a frame that carried an 802.1Q/802.1ad tag: the
// receive path moves the tag into skb metadata before tc runs, so u32 sees
// the inner packet, and a redirect to eth0 would put the tag back on the
// wire. The program overwrites such a frame's Ethernet source with zeros
// (VLANMarkMAC), so that every u32 priority of the veth drops it with
// reason DropVLAN, and lets every frame go on to the next filter
// (TC_ACT_UNSPEC). (It cannot drop itself and be counted: a direct-action
// drop is counted only per qdisc, and netlink's cls_bpf has no actions.)
var progNoVLAN = []bpfInsn{
	{code: bpfMovReg, regs: 6 | 1<<4},                // r6 = skb
	{code: bpfLdxW, regs: 0 | 1<<4, off: skbVLANOff}, // r0 = skb->vlan_present
	{code: bpfJeqImm, regs: 0, off: 8, imm: 0},       // if r0 == 0 goto pass
	{code: bpfStDW, regs: 10, off: -8, imm: 0},       // *(u64 *)(fp - 8) = 0
	{code: bpfMovReg, regs: 1 | 6<<4},                // r1 = skb
	{code: bpfMovImm, regs: 2, imm: 6},               // r2 = offset of the source MAC
	{code: bpfMovReg, regs: 3 | 10<<4},               // r3 = fp
	{code: bpfAddImm, regs: 3, imm: -8},              // r3 -= 8 (six zero bytes)
	{code: bpfMovImm, regs: 4, imm: 6},               // r4 = len
	{code: bpfMovImm, regs: 5, imm: 0},               // r5 = flags
	{code: bpfCall, imm: bpfFuncSkbStoreBytes},
	{code: bpfMovImm, imm: tcActUnspec}, // pass:
	{code: bpfExit},
}

// VLANMarkMAC is the Ethernet source the VLAN check gives a tagged frame.
var VLANMarkMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// loadProg loads a sched_cls program written as instructions (the
// kernel's own 8-byte layout) and returns its fd.
func loadProg(name string, insns []bpfInsn) (int, error) {
	code := unsafe.Slice((*byte)(unsafe.Pointer(&insns[0])), len(insns)*int(unsafe.Sizeof(insns[0])))
	fd, err := loadSchedCls(name, code)
	runtime.KeepAlive(insns)
	return fd, err
}

// loadTries bounds the retries of an interrupted BPF_PROG_LOAD.
const loadTries = 10

// progCache keeps each program loaded once for the life of the process: every
// veth's filter refers to the same program instead of a fresh copy.
var progCache struct {
	sync.Mutex
	fds map[string]int
}

// cachedProg returns the fd of f's program, loading it on first use. The fd
// stays open (the filters hold their own references).
func cachedProg(f bpfFilter) (int, error) {
	progCache.Lock()
	defer progCache.Unlock()
	if fd, ok := progCache.fds[f.name]; ok {
		return fd, nil
	}
	fd, err := loadProg(f.name, f.insns)
	if err != nil {
		return -1, err
	}
	if progCache.fds == nil {
		progCache.fds = map[string]int{}
	}
	progCache.fds[f.name] = fd
	return fd, nil
}

// Names of our cls_bpf filters (the kernel reports them in a dump).
const (
	bpfNameShot   = "isolatord_drop"
	bpfNameNoVLAN = "isolatord_novlan"
)

// bpfFilter describes one of our direct-action cls_bpf filters.
type bpfFilter struct {
	name   string
	insns  []bpfInsn
	parent uint32 // netlink.HANDLE_MIN_INGRESS or HANDLE_MIN_EGRESS
	prio   uint16
}

var (
	shotFilter   = bpfFilter{bpfNameShot, progShot, netlink.HANDLE_MIN_EGRESS, PrioSinkShot}
	noVLANFilter = bpfFilter{bpfNameNoVLAN, progNoVLAN, netlink.HANDLE_MIN_INGRESS, PrioVethVLAN}
)

// present reports whether link has f (by priority and program name).
func (f bpfFilter) present(h *netlink.Handle, link int) (bool, error) {
	fs, err := h.FilterList(linkRef(link), f.parent)
	if err != nil {
		return false, fmt.Errorf("list filters of ifindex %d: %w", link, err)
	}
	for _, x := range fs {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Priority == f.prio && b.DirectAction && b.Name == f.name {
			return true, nil
		}
	}
	return false, nil
}

// filter is the netlink filter that attaches f to link, with the cached
// program.
func (f bpfFilter) filter(link int) (*netlink.BpfFilter, error) {
	fd, err := cachedProg(f)
	if err != nil {
		return nil, err
	}
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: link, Parent: f.parent, Priority: f.prio, Protocol: unix.ETH_P_ALL, Handle: 1,
		},
		Fd: fd, Name: f.name, DirectAction: true,
	}, nil
}

// attach adds f to link (which must have a clsact qdisc). The filter takes
// its own reference to the cached program.
func (f bpfFilter) attach(h *netlink.Handle, link int) error {
	bf, err := f.filter(link)
	if err != nil {
		return err
	}
	if err := h.FilterAdd(bf); err != nil {
		return fmt.Errorf("attach bpf %s to ifindex %d: %w", f.name, link, err)
	}
	return nil
}

// ensure attaches f unless link has it already.
func (f bpfFilter) ensure(h *netlink.Handle, link int) error {
	ok, err := f.present(h, link)
	if err != nil || ok {
		return err
	}
	return f.attach(h, link)
}

// BPFAvailable reports whether this kernel loads our cls_bpf programs (it
// loads one and unloads it).
func BPFAvailable() error {
	fd, err := loadProg(bpfNameShot, progShot)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%w (no BPF_PROG_TYPE_SCHED_CLS)", err)
		}
		return err
	}
	unix.Close(fd)
	return nil
}
