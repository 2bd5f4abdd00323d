//go:build linux

package loader

import (
	"testing"
	"unsafe"
)

// The record layout is the kernel's (bpf/common/contract.h); these pin the
// sizes each kind of record travels with, so a change to them is deliberate.
func TestRecordSizes(t *testing.T) {
	var ev HTTPEvent
	if HTTPEventHeadSize != 152 {
		t.Errorf("response and close records are %d bytes, were 152 (144 before stream_seq)", HTTPEventHeadSize)
	}
	if HTTPEventRewardSize != HTTPEventHeadSize+len(ev.Reward) || len(ev.Reward) != 24 {
		t.Errorf("a response with a reward is %d bytes, want the head and the 24-byte reward", HTTPEventRewardSize)
	}
	if HTTPEventSize != 488 || unsafe.Offsetof(ev.Path) != uintptr(HTTPEventRewardSize) {
		t.Errorf("request records are %d bytes (path at %d), want 488 with the path after the reward", HTTPEventSize, unsafe.Offsetof(ev.Path))
	}
}

// Flags, counters and config bits that C and Go share must stay distinct
// and inside their fields.
func TestContractBits(t *testing.T) {
	flags := []uint16{FlagTraceparent, FlagPathTruncated, FlagEndByClose, FlagChunked, FlagUpgrade, FlagResync,
		FlagConnError, FlagHost, FlagRollout, FlagHdrTruncated, FlagBodyUnknown, FlagTLS, FlagKernelTrace, FlagFresh, FlagReward}
	var seen uint16
	for _, f := range flags {
		if f == 0 || f&(f-1) != 0 || seen&f != 0 {
			t.Errorf("event flag %#x is not a bit of its own", f)
		}
		seen |= f
	}
	if FlagReward != 1<<15 {
		t.Errorf("FlagReward = %#x", FlagReward)
	}
	slots := map[uint32]bool{}
	for _, st := range []uint32{StatRingbufFull, StatNotHTTP, StatParseError, StatHdrTruncated, StatConnFull, StatResync,
		StatSkippedBytes, StatProcEvents, StatTLSCalls, StatTLSEvents, StatTLSLinked, StatUnsampled, StatScanReused,
		StatFresh, StatRewardFound, StatRewardMissed, StatScanPreread, StatStaleConn, StatStoodIn, StatResponseShed} {
		if st < StatDiscarded+16 || st >= StatMax || slots[st] {
			t.Errorf("counter slot %d is outside %d..%d or taken twice", st, StatDiscarded+16, StatMax-1)
		}
		slots[st] = true
	}
	if CfgReward&(CfgRolloutIDs|CfgNoGate) != 0 || CfgReward == 0 {
		t.Errorf("CfgReward = %#x overlaps another config flag", CfgReward)
	}
}

// Every gt_py_stats slot has its own name: a counter added to enum
// gt_py_status must be named for gymtrace_python_context_total.
func TestPyStatNames(t *testing.T) {
	seen := map[string]bool{}
	for i := uint32(0); i < pyStatMax; i++ {
		n := pyStatNames[i]
		if n == "" || seen[n] {
			t.Errorf("gt_py_stats slot %d has no name of its own (%q)", i, n)
		}
		seen[n] = true
	}
	if len(pyStatNames) != int(pyStatMax) {
		t.Errorf("%d names for %d slots", len(pyStatNames), pyStatMax)
	}
}
