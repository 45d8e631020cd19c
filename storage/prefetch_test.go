package storage

import (
	"testing"
	"unsafe"
)

// TestEachLineVisitsEveryLineOnce: for every start within two lines and
// every length up to three lines, eachLine reaches each 64-byte line the
// span touches exactly once, in order, and nothing outside it.
func TestEachLineVisitsEveryLineOnce(t *testing.T) {
	buf := make([]byte, 64*8)
	// The first line start in buf, so that starts cover every alignment.
	a0 := (64 - int(uintptr(unsafe.Pointer(&buf[0]))&63)) & 63
	for start := a0; start < a0+128; start++ {
		for n := 1; n <= 192; n++ {
			b := buf[start : start+n]
			first := uintptr(unsafe.Pointer(&b[0]))
			last := first + uintptr(n) - 1
			var got []uintptr
			eachLine(b, func(p unsafe.Pointer) {
				a := uintptr(p)
				if a < first || a > last {
					t.Fatalf("start %d, %d bytes: pointer %d bytes from the start, outside the span", start, n, int(a)-int(first))
				}
				got = append(got, a/64)
			})
			want := int(last/64 - first/64 + 1)
			if len(got) != want {
				t.Fatalf("start %d, %d bytes: %d lines visited, want %d", start, n, len(got), want)
			}
			for i, line := range got {
				if line != first/64+uintptr(i) {
					t.Fatalf("start %d, %d bytes: visit %d is line %d, want %d", start, n, i, line-first/64, i)
				}
			}
		}
	}
}
