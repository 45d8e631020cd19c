#include "textflag.h"

// func Slots(base unsafe.Pointer, slots []int64, pitch int64)
TEXT ·Slots(SB), NOSPLIT, $0-40
	MOVQ base+0(FP), AX
	MOVQ slots_base+8(FP), SI
	MOVQ slots_len+16(FP), CX
	MOVQ pitch+32(FP), DX
	TESTQ CX, CX
	JEQ done
loop:
	MOVQ (SI), BX
	TESTQ BX, BX
	JS skip
	IMULQ DX, BX
	PREFETCHT0 (AX)(BX*1)
skip:
	ADDQ $8, SI
	DECQ CX
	JNE loop
done:
	RET
