// Package spread decides how the flows of a shared port (a port several
// containers hold at once) are spread over its holders. It is pure: no
// kernel calls, no I/O; tcfilter installs what it decides.
//
// A shared port's flows fall into Buckets virtual buckets by the client's
// source port (Bucket). Assign gives each bucket a holder by rendezvous
// hashing, so a change of holders moves few buckets; Plan moves from the
// spread in force towards that assignment without breaking live flows of
// holders that stay, by pinning their source ports (at most
// MaxPinsPerBucket per bucket); PinLate adds pins for flows that began
// while a spread was being installed.
//
// Tested by table tests of the edge cases (one holder, MaxHolders holders,
// holders added and removed, the pin bound) and a randomised run of joins
// and leaves (go test ./spread); it builds for any GOOS.
package spread
