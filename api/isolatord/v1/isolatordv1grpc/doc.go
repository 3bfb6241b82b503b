// Package isolatordv1grpc is isolatord's Isolator service for grpc-go: the
// client and server stubs generated from service.proto (their messages are
// in isolatordv1, which links no gRPC transport). Package api's Dial
// connects them to the daemon's unix socket.
//
// The *.pb.go files are generated: edit the .proto files and run
// scripts/proto.sh (make proto), never edit them by hand.
package isolatordv1grpc
