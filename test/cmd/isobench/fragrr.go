package main

// Fragmented UDP request/response (issue 32): every case's server also
// serves UDP on its port, and the metric frag_rr sends it requests of
// fragRequest bytes (three fragments at MTU 1500, IPv4 and IPv6) that it
// answers with one byte. Through the isolator the first fragment goes to
// the container by its port, the later ones after it (package
// tcfilter/fragbpf); (b)/(a) compares that with a server in the bare
// host namespace.

const (
	fragRequest = 4000
	fragLabel   = "fragmented UDP r/r (4,000 B)"
)
