package bpfprog

// One object per program source; see the package documentation for what
// regenerating needs. -mcpu=v3: atomic fetch-and-add and 32-bit jumps.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package bpfprog -tags linux -target bpfel Shot shot.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package bpfprog -tags linux -target bpfel NoVLAN novlan.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package bpfprog -tags linux -target bpfel Count count.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package bpfprog -tags linux -target bpfel Echo echo.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package bpfprog -tags linux -target bpfel Echo6 echo6.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
