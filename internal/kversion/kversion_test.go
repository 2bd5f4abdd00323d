package kversion

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in           string
		major, minor int
		ok           bool
	}{
		{"6.18.44-fc-v1294", 6, 18, true},
		{"6.1.0-57-amd64", 6, 1, true},
		{"6.4-rc1", 6, 4, true},
		{"5.15.0-91-generic", 5, 15, true},
		{"6", 0, 0, false},
		{"x.y", 0, 0, false},
	} {
		ma, mi, ok := Parse(tc.in)
		if ma != tc.major || mi != tc.minor || ok != tc.ok {
			t.Errorf("Parse(%q) = %d, %d, %v; want %d, %d, %v", tc.in, ma, mi, ok, tc.major, tc.minor, tc.ok)
		}
	}
	if ma, _, ok := Running(); !ok || ma < 3 {
		t.Errorf("Running() = %d, %v: this kernel's version does not read", ma, ok)
	}
}
