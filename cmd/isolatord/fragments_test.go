package main

import (
	"strings"
	"testing"
)

func TestCheckFragTableSize(t *testing.T) {
	for _, n := range []int{0, -1, 256, 8192, 1 << 20} {
		if err := checkFragTableSize(n); err != nil {
			t.Errorf("%d: %v", n, err)
		}
	}
	for _, n := range []int{1, 255, 1<<20 + 1} {
		if err := checkFragTableSize(n); err == nil || !strings.Contains(err.Error(), "--fragment-table-size") {
			t.Errorf("%d: %v, want an error naming the flag", n, err)
		}
	}
}
