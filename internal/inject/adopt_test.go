//go:build linux

package inject

import (
	"slices"
	"testing"
)

func TestOutboundInTables(t *testing.T) {
	v4 := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:C351 0100007F:0050 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000
   4: 0100007F:C352 0100007F:1F91 01 00000000:00000000 00:00000000 00000000     0        0 104 1 0000000000000000 20 4 30 10 -1
`
	v6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:C353 00000000000000000000000001000000:01BB 01 00000000:00000000 00:00000000 00000000     0        0 105 1 0000000000000000 20 4 30 10 -1
`
	// fd 3: accepted by the listener on 8080 (0x1F90); fd 4: this process's
	// own connection to 8080; fd 5: a socket of another process (not in the
	// map); fd 6: IPv6 outbound; 104 is not ours.
	got := outboundInTables([]string{v4, v6}, map[uint64]int{100: 2, 101: 3, 102: 4, 105: 6})
	slices.Sort(got)
	if !slices.Equal(got, []int{4, 6}) {
		t.Fatalf("outbound fds = %v, want [4 6] (the listener, the accepted socket and TIME_WAIT are not outbound)", got)
	}
	if got := outboundInTables([]string{""}, map[uint64]int{1: 1}); len(got) != 0 {
		t.Fatalf("an empty table gave %v", got)
	}
}

func TestAdoptConnectionsNilAndMissingMaps(t *testing.T) {
	var in *Injector
	if n, err := in.AdoptConnections(1); n != 0 || err != nil {
		t.Fatalf("nil injector: %d, %v", n, err)
	}
	if _, err := (&Injector{}).AdoptConnections(1); err == nil {
		t.Fatal("an injector without its maps must say so")
	}
}
