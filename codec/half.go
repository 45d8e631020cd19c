package codec

import "math"

// Float32ToFloat16 converts with round-to-nearest-even, as numpy does;
// values beyond the float16 range become infinities, NaN stays NaN.
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b >> 23) & 0xff)
	man := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half (or zero): shift the implicit-1 mantissa.
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		half := uint32(1) << (shift - 1)
		rounded := m >> shift
		rem := m & ((1 << shift) - 1)
		if rem > half || (rem == half && rounded&1 == 1) {
			rounded++
		}
		return sign | uint16(rounded)
	}
	rounded := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && rounded&1 == 1) {
		rounded++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(rounded)
}

// Float16ToFloat32 is exact.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / (1 << 24)
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// Float32ToBFloat16 keeps the top 16 bits with round-to-nearest-even.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16ToFloat32 is exact.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float64ToFloat16 rounds a float64 straight to float16 (round to nearest
// even). Going through float32 would round twice and, near ties, differ
// from numpy.
func Float64ToFloat16(f float64) uint16 { return roundFloat64(f, 5, 10) }

// Float64ToBFloat16 rounds a float64 straight to bfloat16.
func Float64ToBFloat16(f float64) uint16 { return roundFloat64(f, 8, 7) }

// roundFloat64 rounds f to a binary float with ebits exponent and mbits
// mantissa bits (at most 16 bits in all), round to nearest even.
func roundFloat64(f float64, ebits, mbits uint) uint16 {
	b := math.Float64bits(f)
	sign := uint16(b>>63) << (ebits + mbits)
	exp := int((b >> 52) & 0x7ff)
	man := b & (1<<52 - 1)
	maxExp := uint64(1)<<ebits - 1
	if exp == 0x7ff {
		if man != 0 {
			return sign | uint16(maxExp<<mbits) | 1<<(mbits-1) // quiet NaN
		}
		return sign | uint16(maxExp<<mbits)
	}
	if exp == 0 {
		return sign // float64 subnormals are far below any 16-bit float
	}
	bias := 1<<(ebits-1) - 1
	e := exp - 1023 + bias
	if e >= int(maxExp) {
		return sign | uint16(maxExp<<mbits)
	}
	var shift uint
	var m uint64
	if e >= 1 {
		shift = 52 - mbits
		m = uint64(e)<<52 | man // exponent rides above the mantissa; a carry rounds into it
	} else {
		s := 53 - int(mbits) - e
		if s > 53 {
			return sign // below half the smallest subnormal
		}
		shift = uint(s)
		m = man | 1<<52
	}
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint64(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(r)
}
