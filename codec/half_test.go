package codec

import (
	"fmt"
	"math"
	"testing"
)

// f16Value is the exact value of a finite float16 bit pattern, computed
// independently of Float16ToFloat32.
func f16Value(h uint16) float64 {
	exp := int(h>>10) & 0x1f
	man := float64(h & 0x3ff)
	var v float64
	if exp == 0 {
		v = math.Ldexp(man, -24)
	} else {
		v = math.Ldexp(1024+man, exp-25)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

func isNaN16(h uint16) bool   { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
func isNaNbf(h uint16) bool   { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }
func f32(b uint32) float32    { return math.Float32frombits(b) }
func bitsOf(f float32) uint32 { return math.Float32bits(f) }

// refFloat16 rounds a finite or infinite float64 to float16 bits, to nearest
// even, by bisecting the ordered positive bit patterns: the slow, obvious
// way.
func refFloat16(x float64) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	if math.IsInf(x, 0) {
		return sign | 0x7c00
	}
	// Largest pattern lo in [0, 0x7bff] with value <= x.
	lo, hi := uint16(0), uint16(0x7c00)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if f16Value(mid) <= x {
			lo = mid
		} else {
			hi = mid
		}
	}
	if f16Value(lo) == x {
		return sign | lo
	}
	// The next value up; 0x7c00's "value" is where rounding reaches
	// infinity, 65504 + 16 on the same grid.
	next := 65536.0
	if lo < 0x7bff {
		next = f16Value(lo + 1)
	}
	half := (f16Value(lo) + next) / 2 // exact: 12 significant bits
	switch {
	case x < half:
		return sign | lo
	case x > half:
		return sign | (lo + 1)
	case lo&1 == 0:
		return sign | lo
	}
	return sign | (lo + 1)
}

// refBFloat16 rounds a float32 to bfloat16 to nearest even.
func refBFloat16(x float32) uint16 {
	b := bitsOf(x)
	lo := uint16(b >> 16)
	up := lo + 1
	vlo := float64(f32(uint32(lo) << 16))
	if math.IsInf(vlo, 0) {
		return lo
	}
	vup := float64(f32(uint32(up) << 16)) // may be infinite past the top
	if math.IsInf(vup, 0) {
		vup = math.Copysign(0x1p128, vlo)
	}
	half := (vlo + vup) / 2
	ax, ah := math.Abs(float64(x)), math.Abs(half)
	switch {
	case ax < ah:
		return lo
	case ax > ah:
		return up
	case lo&1 == 0:
		return lo
	}
	return up
}

func TestFloat16ExhaustiveRoundTrip(t *testing.T) {
	for i := 0; i <= 0xffff; i++ {
		h := uint16(i)
		f := Float16ToFloat32(h)
		switch {
		case isNaN16(h):
			if !math.IsNaN(float64(f)) {
				t.Fatalf("Float16ToFloat32(%#04x) = %v, want NaN", h, f)
			}
			if back := Float32ToFloat16(f); !isNaN16(back) || back&0x8000 != h&0x8000 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		case h&0x7fff == 0x7c00:
			if !math.IsInf(float64(f), 0) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
				t.Fatalf("Float16ToFloat32(%#04x) = %v", h, f)
			}
		default:
			if want := f16Value(h); float64(f) != want || math.Signbit(float64(f)) != math.Signbit(want) {
				t.Fatalf("Float16ToFloat32(%#04x) = %v, want %v", h, f, want)
			}
		}
		if back := Float32ToFloat16(f); back != h {
			t.Fatalf("Float32ToFloat16(Float16ToFloat32(%#04x) = %v) = %#04x", h, f, back)
		}
	}
}

func TestBFloat16ExhaustiveRoundTrip(t *testing.T) {
	for i := 0; i <= 0xffff; i++ {
		h := uint16(i)
		f := BFloat16ToFloat32(h)
		if bitsOf(f) != uint32(h)<<16 {
			t.Fatalf("BFloat16ToFloat32(%#04x) = %#08x", h, bitsOf(f))
		}
		back := Float32ToBFloat16(f)
		if isNaNbf(h) {
			if !isNaNbf(back) || back&0x8000 != h&0x8000 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("Float32ToBFloat16(%v) = %#04x, want %#04x", f, back, h)
		}
	}
}

// TestFloat16HalfwayCases builds, for every pair of neighbouring finite
// float16 values, the float32 exactly halfway between them and the float32s
// one ulp either side.
func TestFloat16HalfwayCases(t *testing.T) {
	for h := uint16(0); h < 0x7c00; h++ {
		next := 65536.0 // the halfway point to "infinity" is 65520
		if h < 0x7bff {
			next = f16Value(h + 1)
		}
		half := float32((f16Value(h) + next) / 2) // exact in float32
		if float64(half) != (f16Value(h)+next)/2 {
			t.Fatalf("%#04x: halfway point not exact", h)
		}
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		below := math.Nextafter32(half, 0)
		above := math.Nextafter32(half, math.MaxFloat32)
		for _, sign := range []uint16{0, 0x8000} {
			neg := func(f float32) float32 {
				if sign != 0 {
					return -f
				}
				return f
			}
			for _, c := range []struct {
				x    float32
				want uint16
			}{{half, even}, {below, h}, {above, h + 1}} {
				if got := Float32ToFloat16(neg(c.x)); got != sign|c.want {
					t.Fatalf("Float32ToFloat16(%g [%#08x]) = %#04x, want %#04x", neg(c.x), bitsOf(neg(c.x)), got, sign|c.want)
				}
			}
		}
	}
}

func TestBFloat16HalfwayCases(t *testing.T) {
	for h := uint32(0); h < 0x7f80; h++ {
		half := h<<16 | 0x8000 // exactly halfway to h+1
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		for _, sign := range []uint32{0, 0x80000000} {
			for _, c := range []struct {
				bits uint32
				want uint32
			}{{half, even}, {half - 1, h}, {half + 1, h + 1}, {h << 16, h}, {h<<16 | 0x7fff, h}} {
				if got := Float32ToBFloat16(f32(sign | c.bits)); uint32(got) != sign>>16|c.want {
					t.Fatalf("Float32ToBFloat16(%#08x) = %#04x, want %#04x", sign|c.bits, got, sign>>16|c.want)
				}
			}
		}
	}
}

// TestFloat16AgainstReference compares with the bisecting reference on a
// stride through all float32 bit patterns (both signs, every exponent).
func TestFloat16AgainstReference(t *testing.T) {
	stride := uint32(65521) // prime: visits varied low bits
	if testing.Short() {
		stride = 1000003
	}
	n := 0
	for b := uint64(0); b <= math.MaxUint32; b += uint64(stride) {
		x := f32(uint32(b))
		if math.IsNaN(float64(x)) {
			continue
		}
		n++
		if got, want := Float32ToFloat16(x), refFloat16(float64(x)); got != want {
			t.Fatalf("Float32ToFloat16(%g [%#08x]) = %#04x, reference says %#04x", x, uint32(b), got, want)
		}
		if got, want := Float32ToBFloat16(x), refBFloat16(x); got != want {
			t.Fatalf("Float32ToBFloat16(%g [%#08x]) = %#04x, reference says %#04x", x, uint32(b), got, want)
		}
	}
	if n < 4000 {
		t.Fatalf("only %d values checked", n)
	}
}

func TestFloat16Special(t *testing.T) {
	for _, c := range []struct {
		name string
		x    float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"max finite", 65504, 0x7bff},
		{"just below overflow", math.Nextafter32(65520, 0), 0x7bff},
		{"overflow at the halfway point", 65520, 0x7c00},
		{"overflow", 1e5, 0x7c00},
		{"negative overflow", -1e10, 0xfc00},
		{"float32 max", math.MaxFloat32, 0x7c00},
		{"+Inf", float32(math.Inf(1)), 0x7c00},
		{"-Inf", float32(math.Inf(-1)), 0xfc00},
		{"smallest normal", 0x1p-14, 0x0400},
		{"largest subnormal", 0x3ffp-24, 0x03ff},
		{"subnormal rounds up to normal", 0x3ff8p-28 + 0x1p-30, 0x0400},
		{"smallest subnormal", 0x1p-24, 0x0001},
		{"negative smallest subnormal", -0x1p-24, 0x8001},
		{"half the smallest subnormal ties to zero", 0x1p-25, 0x0000},
		{"just above half the smallest subnormal", math.Nextafter32(0x1p-25, 1), 0x0001},
		{"one and a half subnormals tie to two", 3 * 0x1p-25, 0x0002},
		{"two and a half subnormals tie to two", 5 * 0x1p-25, 0x0002},
		{"tiny underflows to zero", 1e-10, 0x0000},
		{"tiny negative underflows to -0", -1e-10, 0x8000},
		{"float32 subnormal", math.SmallestNonzeroFloat32, 0x0000},
		{"negative float32 subnormal", -math.SmallestNonzeroFloat32, 0x8000},
		{"1 + 2^-11 ties to even (down)", 1 + 0x1p-11, 0x3c00},
		{"1 + 3*2^-11 ties to even (up)", 1 + 3*0x1p-11, 0x3c02},
		{"0.1", 0.1, 0x2e66},
		{"pi", math.Pi, 0x4248},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Float32ToFloat16(c.x); got != c.want {
				t.Errorf("Float32ToFloat16(%g) = %#04x, want %#04x", c.x, got, c.want)
			}
		})
	}
	if f := Float16ToFloat32(0x8000); f != 0 || !math.Signbit(float64(f)) {
		t.Errorf("Float16ToFloat32(0x8000) = %v, want -0", f)
	}
	for _, nan := range []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fbfffff, 0x7f802000, 0x7fffffff} {
		h := Float32ToFloat16(f32(nan))
		if !isNaN16(h) || h>>15 != uint16(nan>>31) {
			t.Errorf("Float32ToFloat16(NaN %#08x) = %#04x, want a NaN of the same sign", nan, h)
		}
		b := Float32ToBFloat16(f32(nan))
		if !isNaNbf(b) || b>>15 != uint16(nan>>31) {
			t.Errorf("Float32ToBFloat16(NaN %#08x) = %#04x, want a NaN of the same sign", nan, b)
		}
	}
}

func TestBFloat16Special(t *testing.T) {
	for _, c := range []struct {
		bits uint32
		want uint16
	}{
		{0x00000000, 0x0000},
		{0x80000000, 0x8000},
		{0x3f800000, 0x3f80},           // 1
		{0x3f808000, 0x3f80},           // 1 + 2^-8: tie, to even (down)
		{0x3f818000, 0x3f82},           // tie, to even (up)
		{0x3f808001, 0x3f81},           // just above the tie
		{0x7f7f0000, 0x7f7f},           // max finite bfloat16
		{0x7f7f8000, 0x7f80},           // tie at the top: to even = Inf
		{0x7f7fffff, 0x7f80},           // float32 max overflows
		{0xff7fffff, 0xff80},           // and its negative
		{0x7f800000, 0x7f80},           // +Inf
		{0xff800000, 0xff80},           // -Inf
		{0x00000001, 0x0000},           // float32 subnormal
		{0x00008000, 0x0000},           // tie to even zero
		{0x00018000, 0x0002},           // tie to even
		{0x00400000, 0x0040},           // subnormal kept
		{bitsOf(math.Pi), 0x4049},      // 3.140625
		{bitsOf(0.1), 0x3dcd},          // 0.10009765625
		{bitsOf(-65504), 0xc780},       // -65536
		{bitsOf(1 + 0x1p-9), 0x3f80},   // below halfway
		{bitsOf(1.00390625), 0x3f80},   // halfway (2^-8), even
		{bitsOf(1.01171875), 0x3f82},   // 1+3*2^-8: halfway, even up
		{bitsOf(1e-45), 0x0000},        // tiny
		{bitsOf(-3.4e38), 0xff80},      // rounds past max to -Inf
		{bitsOf(3.3895314e38), 0x7f7f}, // max finite bfloat16
	} {
		if got := Float32ToBFloat16(f32(c.bits)); got != c.want {
			t.Errorf("Float32ToBFloat16(%g [%#08x]) = %#04x, want %#04x", f32(c.bits), c.bits, got, c.want)
		}
	}
	if f := BFloat16ToFloat32(0x8000); f != 0 || !math.Signbit(float64(f)) {
		t.Errorf("BFloat16ToFloat32(0x8000) = %v, want -0", f)
	}
}

func ExampleFloat32ToFloat16() {
	for _, x := range []float32{1, 0.1, 65504, 65520, 0x1p-25} {
		h := Float32ToFloat16(x)
		fmt.Printf("%g -> %#04x -> %g\n", x, h, Float16ToFloat32(h))
	}
	// Output:
	// 1 -> 0x3c00 -> 1
	// 0.1 -> 0x2e66 -> 0.099975586
	// 65504 -> 0x7bff -> 65504
	// 65520 -> 0x7c00 -> +Inf
	// 2.9802322e-08 -> 0x0000 -> 0
}
