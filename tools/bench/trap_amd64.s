#include "textflag.h"

// trapTarget is what the tax phase's uprobe rows trap on: its first
// instruction is a push, which x86-64 uprobes emulate (no single step), the
// kind of site gymtrace's context-copy probe sits on in Debian's CPython
// 3.11 and 3.13.
TEXT ·trapTarget(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	POPQ BP
	RET
