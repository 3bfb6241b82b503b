//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package bpfprog

// (The build constraint is the generated files': little-endian Linux.)

// Object returns the bytes of the compiled object of program source name
// ("shot", "novlan", "count", "echo", "echo6"), nil for another name.
// Filter names carry a digest of them, so that a restarted daemon adopts
// only programs of the same code.
func Object(name string) []byte {
	switch name {
	case "shot":
		return _ShotBytes
	case "novlan":
		return _NoVLANBytes
	case "count":
		return _CountBytes
	case "echo":
		return _EchoBytes
	case "echo6":
		return _Echo6Bytes
	}
	return nil
}
