package python

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Version is a CPython version, decoded from PY_VERSION_HEX.
type Version struct {
	Major, Minor, Micro int
	Hex                 uint32
}

func versionFromHex(h uint32) Version {
	return Version{Major: int(h >> 24), Minor: int(h >> 16 & 0xff), Micro: int(h >> 8 & 0xff), Hex: h}
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// layout is the part of Params that depends on the CPython version.
type layout struct {
	runtimeInterpHead, interpNext, interpThreadsHead uint16
	tstateNext, tstateNativeTid, tstateContext       uint16
	ctxPrev, obType                                  uint16
}

// Offsets for the versions without _Py_DebugOffsets, x86-64 and arm64 alike
// (LP64, default non-debug builds). Measured with offsetof() against each
// version's internal headers (Debian's 3.11.2, CPython 3.11.7, 3.12.1) and
// proven on live processes by the tests (Walk).
var staticLayouts = map[[2]int]layout{
	{3, 11}: {runtimeInterpHead: 40, interpNext: 0, interpThreadsHead: 16,
		tstateNext: 8, tstateNativeTid: 160, tstateContext: 224, ctxPrev: 16, obType: 8},
	{3, 12}: {runtimeInterpHead: 40, interpNext: 0, interpThreadsHead: 72,
		tstateNext: 8, tstateNativeTid: 144, tstateContext: 208, ctxPrev: 16, obType: 8},
}

// PyThreadState.context, which _Py_DebugOffsets does not describe. 3.13 is
// measured (offsetof on 3.13.0, live on Debian's 3.13.5); 3.14 is from its
// headers and is proven per process by Inspect's live walk before use.
var contextOffsets = map[[2]int]uint16{
	{3, 13}: 208,
	{3, 14}: 208,
}

// Where the fields gymtrace needs sit inside struct _Py_DebugOffsets. The
// struct is not self-describing (sub-structs grow between minors), so its own
// layout is per minor too: 3.13 has 13 interpreter_state fields, 3.14 has 16.
type debugLayout struct {
	interpretersHead, interpNext, interpThreadsHead int
	tstateNext, tstateNativeTid                     int
}

var debugLayouts = map[[2]int]debugLayout{
	{3, 13}: {interpretersHead: 40, interpNext: 64, interpThreadsHead: 72, tstateNext: 168, tstateNativeTid: 200},
	{3, 14}: {interpretersHead: 40, interpNext: 64, interpThreadsHead: 72, tstateNext: 192, tstateNativeTid: 224},
}

const (
	debugCookie      = "xdebugpy"
	debugHeaderBytes = 256 // enough for every field in debugLayouts
	offFreeThreaded  = 16
)

// layoutFor returns the layout of version v; debugOffsets is the start of
// _PyRuntime (at least debugHeaderBytes), used from 3.13 on.
func layoutFor(v Version, debugOffsets []byte) (layout, error) {
	key := [2]int{v.Major, v.Minor}
	if l, ok := staticLayouts[key]; ok {
		return l, nil
	}
	dl, ok := debugLayouts[key]
	if !ok {
		return layout{}, fmt.Errorf("CPython %s is not supported (supported: 3.11 to 3.14)", v)
	}
	if len(debugOffsets) < debugHeaderBytes || !bytes.Equal(debugOffsets[:8], []byte(debugCookie)) {
		return layout{}, fmt.Errorf("CPython %s: _PyRuntime does not start with the %q debug cookie; "+
			"the runtime may not be initialised yet", v, debugCookie)
	}
	le := binary.LittleEndian
	if hv := uint32(le.Uint64(debugOffsets[8:])); hv>>16 != v.Hex>>16 {
		return layout{}, fmt.Errorf("_Py_DebugOffsets says version %s, Py_Version says %s",
			versionFromHex(hv), v)
	}
	if le.Uint64(debugOffsets[offFreeThreaded:]) != 0 {
		return layout{}, fmt.Errorf("CPython %s free-threaded build is not supported "+
			"(its object header differs and contexts are per thread)", v)
	}
	field := func(at int) (uint16, error) {
		x := le.Uint64(debugOffsets[at:])
		if x == 0 || x > 0xffff {
			return 0, fmt.Errorf("CPython %s: implausible offset %d at _Py_DebugOffsets+%d", v, x, at)
		}
		return uint16(x), nil
	}
	var l layout
	var err error
	for _, f := range []struct {
		dst *uint16
		at  int
	}{
		{&l.runtimeInterpHead, dl.interpretersHead},
		{&l.interpThreadsHead, dl.interpThreadsHead},
		{&l.tstateNext, dl.tstateNext},
		{&l.tstateNativeTid, dl.tstateNativeTid},
	} {
		if *f.dst, err = field(f.at); err != nil {
			return layout{}, err
		}
	}
	// PyInterpreterState.next may legitimately sit at offset 0, which field()
	// would reject; a wrong value only ends the walk early.
	l.interpNext = uint16(le.Uint64(debugOffsets[dl.interpNext:]))
	l.tstateContext = contextOffsets[key]
	l.ctxPrev, l.obType = 16, 8
	return l, nil
}
