// Package isolatordv1 is isolatord's gRPC protocol, version 1: the Isolator
// service (Prepare, Isolate, Update, Usage, Cleanup, Get, List, Status) and its
// messages, generated from isolator.proto, which documents every field and the
// error codes the daemon answers with.
//
// The *.pb.go files are generated: edit isolator.proto and run
// scripts/proto.sh (make proto), never edit them by hand. Clients usually
// connect with github.com/isolatord/isolatord/api.Dial.
package isolatordv1
