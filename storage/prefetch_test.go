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

// TestOneLine: oneLine says true only when each row's span lies in one
// cache line (checked row by row with eachLine), and true for the usual
// small rows.
func TestOneLine(t *testing.T) {
	buf := make([]byte, 64*2000+64)
	a0 := (64 - int(uintptr(unsafe.Pointer(&buf[0]))&63)) & 63
	aligned := buf[a0:]
	for _, tc := range []struct {
		pitch, span int64
		misaligned  bool
		want        bool
	}{
		{64, 64, false, true},    // a row group of one line a row, file records
		{16, 16, false, true},    // a float32[4] column
		{1, 1, false, true},      // a flags column
		{128, 64, false, true},   // the first line of longer rows
		{64, 65, false, false},   // a span past the line
		{16, 17, false, false},   // a span past the row
		{48, 16, false, false},   // rows that straddle lines
		{128, 100, false, false}, // two lines a row
		{16, 16, true, false},    // data not at a line start
	} {
		data := aligned
		if tc.misaligned {
			data = aligned[8:]
		}
		if got := oneLine(data, tc.pitch, tc.span); got != tc.want {
			t.Errorf("oneLine(pitch %d, span %d, misaligned %v) = %v, want %v", tc.pitch, tc.span, tc.misaligned, got, tc.want)
		}
		if !oneLine(data, tc.pitch, tc.span) {
			continue
		}
		for row := int64(0); (row+1)*tc.pitch <= int64(len(data)) && row < 1000; row++ {
			lines := 0
			eachLine(data[row*tc.pitch:row*tc.pitch+tc.span], func(unsafe.Pointer) { lines++ })
			if lines != 1 {
				t.Fatalf("pitch %d, span %d: row %d spans %d lines, oneLine said 1", tc.pitch, tc.span, row, lines)
			}
		}
	}
}
