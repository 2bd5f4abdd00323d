package python

import (
	"encoding/binary"
	"strings"
	"testing"
)

func TestCtxID(t *testing.T) {
	id := CtxID(0x7f83ff84a040 | 28821<<48)
	if id.Addr() != 0x7f83ff84a040 || id.Gen() != 28821 {
		t.Fatalf("%s: addr %#x gen %d", id, id.Addr(), id.Gen())
	}
	if CtxID(0).String() != "ctx(none)" {
		t.Fatal(CtxID(0).String())
	}
}

func TestLinksAncestors(t *testing.T) {
	a, b, c := CtxID(0x1000|1<<48), CtxID(0x2000|7<<48), CtxID(0x3000|2<<48)
	births := map[uint64]Link{
		a.Addr(): {Parent: b, Gen: 1},
		b.Addr(): {Parent: c, Gen: 7},
		c.Addr(): {Parent: a, Gen: 3}, // c was born again since: generation 3, not 2
	}
	calls := 0
	ls := newLinks(func(id CtxID) (Link, bool, error) {
		calls++
		l, ok := births[id.Addr()]
		if !ok || l.Gen != id.Gen() {
			return Link{}, false, nil
		}
		return l, true, nil
	})
	got, err := ls.Ancestors(a, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != a || got[1] != b || got[2] != c {
		t.Fatalf("ancestors %v, want [a b c] ending where c's generation no longer matches", got)
	}
	before := calls
	if _, err := ls.Ancestors(a, 10); err != nil {
		t.Fatal(err)
	}
	if calls-before != 1 { // a and b cached; c (a miss) asked again
		t.Errorf("second walk made %d lookups, want 1", calls-before)
	}
	if got, _ := ls.Ancestors(a, 2); len(got) != 2 {
		t.Errorf("max not honoured: %v", got)
	}
}

// A synthetic 3.13 _PyRuntime head: the layout comes from _Py_DebugOffsets,
// the context offset from the table, and bad headers are refused.
func TestLayoutFromDebugOffsets(t *testing.T) {
	v := versionFromHex(0x030d05f0)
	head := make([]byte, debugHeaderBytes)
	copy(head, debugCookie)
	le := binary.LittleEndian
	le.PutUint64(head[8:], 0x030d05f0)
	dl := debugLayouts[[2]int{3, 13}]
	le.PutUint64(head[dl.interpretersHead:], 632)
	le.PutUint64(head[dl.interpNext:], 7264)
	le.PutUint64(head[dl.interpThreadsHead:], 7344)
	le.PutUint64(head[dl.tstateNext:], 8)
	le.PutUint64(head[dl.tstateNativeTid:], 160)
	l, err := layoutFor(v, head)
	if err != nil {
		t.Fatal(err)
	}
	want := layout{runtimeInterpHead: 632, interpNext: 7264, interpThreadsHead: 7344,
		tstateNext: 8, tstateNativeTid: 160, tstateContext: 208, ctxPrev: 16, obType: 8}
	if l != want {
		t.Fatalf("layout %+v, want %+v", l, want)
	}

	le.PutUint64(head[offFreeThreaded:], 1)
	if _, err := layoutFor(v, head); err == nil || !strings.Contains(err.Error(), "free-threaded") {
		t.Errorf("free-threaded build accepted: %v", err)
	}
	le.PutUint64(head[offFreeThreaded:], 0)
	head[0] = 'y'
	if _, err := layoutFor(v, head); err == nil {
		t.Error("missing cookie accepted")
	}
	if _, err := layoutFor(versionFromHex(0x030a0000), nil); err == nil {
		t.Error("3.10 accepted")
	}
	if l, err := layoutFor(versionFromHex(0x030b02f0), nil); err != nil || l.tstateContext != 224 {
		t.Errorf("3.11: %+v %v", l, err)
	}
}

func TestVersionFromName(t *testing.T) {
	for name, want := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/libpython3.13.so.1.0": "3.13.0",
		"/usr/bin/python3.11":                            "3.11.0",
	} {
		v, ok := versionFromName(name)
		if !ok || v.String() != want {
			t.Errorf("%s: %v %v", name, v, ok)
		}
	}
	if _, ok := versionFromName("/usr/bin/python3"); ok {
		t.Error("python3 has no minor version")
	}
}
