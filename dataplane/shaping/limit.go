package shaping

import "github.com/isolatord/isolatord/isolator/plane/rate"

// The fifo leaf's sizes.
const (
	minQueue  = 128 << 10 // bytes: fifo leaf floor (two 64 KiB GSO packets)
	maxQueue  = 64 << 20  // bytes: fifo leaf ceiling
	queueTime = 10        // queue = rate / queueTime (100 ms)
)

// QueueBytes is the byte limit of the fifo leaf for l: ~100 ms at the
// highest rate l allows, within [128 KiB, 64 MiB].
func QueueBytes(l rate.Limit) uint32 {
	r := max(l.Rate, l.Ceil) / queueTime
	return uint32(min(max(r, minQueue), maxQueue))
}

// Leaf is the queue under the HTB class.
type Leaf int

// Leaf kinds, best first.
const (
	LeafFIFO    Leaf = iota // bfifo sized by QueueBytes (always available)
	LeafFQCodel             // fq_codel with kernel defaults (flow fairness, low delay)
)

func (k Leaf) String() string {
	if k == LeafFQCodel {
		return "fq_codel"
	}
	return "bfifo"
}
