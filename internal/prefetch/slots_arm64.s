#include "textflag.h"

// func Slots(base unsafe.Pointer, slots []int64, pitch int64)
TEXT ·Slots(SB), NOSPLIT, $0-40
	MOVD base+0(FP), R0
	MOVD slots_base+8(FP), R1
	MOVD slots_len+16(FP), R2
	MOVD pitch+32(FP), R3
	CBZ R2, done
loop:
	MOVD.P 8(R1), R4
	TBNZ $63, R4, skip
	MUL R3, R4, R5
	ADD R0, R5, R5
	PRFM (R5), PLDL1KEEP
skip:
	SUB $1, R2, R2
	CBNZ R2, loop
done:
	RET
