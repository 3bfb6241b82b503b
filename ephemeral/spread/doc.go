// Package spread decides how the flows of a shared port (a port several
// containers hold at once) are spread over its holders. It is pure: no
// kernel calls, no I/O; tcfilter installs what it decides.
//
// A shared port's flows fall into Buckets virtual buckets by the client's
// source port (Bucket). Assign gives each bucket a holder by rendezvous
// hashing, so a change of holders moves few buckets; PlanFacts moves from
// the spread in force towards that assignment without breaking live flows
// of holders that stay, by pinning their flows (client address and
// source port, Flow; at most
// MaxPinsPerBucket per bucket); PinLate adds pins for flows that began
// while a spread was being installed. A flow is live when the holder's
// namespace lists it and the host saw its traffic lately (Facts.Seen: a
// tenant writes its socket table, not the host's counters); a holder keeps
// back at most MaxHeld buckets, for as long as Facts.MayHold allows, so a
// joiner gets its share whatever the others hold open.
//
// Tested by table tests of the edge cases (one holder, MaxHolders holders,
// holders added and removed, the pin bound, hoarding holders) and a
// randomised run of joins and leaves (go test ./spread); it builds for any
// GOOS.
package spread
