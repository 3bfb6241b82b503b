// Package isolatordv1 is isolatord's gRPC protocol, version 1: the messages
// of the Isolator service, generated from isolator.proto, which documents
// every field and the error codes the daemon answers with. The service
// itself (Prepare, Isolate, Attach, Update, Usage, Cleanup, Get, List,
// Status, RemoveUnattributed) is in isolatordv1grpc, so that importing the
// messages links no gRPC transport.
//
// The *.pb.go files are generated: edit isolator.proto and run
// scripts/proto.sh (make proto), never edit them by hand. Clients usually
// connect with github.com/isolatord/isolatord/api.Dial.
package isolatordv1
