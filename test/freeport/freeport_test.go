package freeport

import "testing"

func TestCandidateOutsideRange(t *testing.T) {
	for _, r := range [][2]int{{32768, 60999}, {1024, 65535}, {10000, 65535}, {40000, 50000}, {20000, 30000}} {
		lo, hi := r[0], r[1]
		for range 5000 {
			p := candidate(lo, hi)
			if p == 0 {
				if lo <= lowest && hi >= 65535 {
					continue // no room: the caller falls back to port 0
				}
				t.Fatalf("range %d-%d: no candidate though there is room", lo, hi)
			}
			if p < lowest || p > 65535 || (p >= lo && p <= hi) {
				t.Fatalf("range %d-%d: candidate %d is inside it or out of bounds", lo, hi, p)
			}
		}
	}
}

func TestPickIsFreeAndOutsideRange(t *testing.T) {
	lo, hi := ephemeralRange()
	p, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	if p >= lo && p <= hi && !(lo <= lowest && hi >= 65535) {
		t.Fatalf("port %d is inside the ephemeral range %d-%d", p, lo, hi)
	}
}

// Picks in one process are distinct: two servers started after two picks
// must not be given the same port.
func TestPicksDistinct(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d picked twice", p)
		}
		seen[p] = true
	}
}
