// Package tcfilter is isolatord's data plane in tc: u32 classifiers with
// mirred actions that steer packets by port between the host and the
// containers that share its IPv4 address. (Full design in the package
// documentation below; filled in as the layout settles.)
package tcfilter
