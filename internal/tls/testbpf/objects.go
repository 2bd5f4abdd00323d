package testbpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Objects is the loaded test object.
type Objects = tlstestObjects

// Event is the http_event record layout.
type Event = tlstestHttpEvent

// Config is struct gt_config; Target is struct gt_target.
type (
	Config = tlstestGtConfig
	Target = tlstestGtTarget
)

// Contract values the tests check.
const (
	EvRequest         = uint8(tlstestGtEventKindGT_EV_REQUEST)
	EvResponse        = uint8(tlstestGtEventKindGT_EV_RESPONSE)
	EvClose           = uint8(tlstestGtEventKindGT_EV_CLOSE)
	EvGenAI           = uint8(tlstestGtEventKindGT_EV_GENAI)
	FlagTLS           = uint16(tlstestGtEventFlagGT_F_TLS)
	FlagChunked       = uint16(tlstestGtEventFlagGT_F_CHUNKED)
	FlagHost          = uint16(tlstestGtEventFlagGT_F_HOST)
	FlagEndByClose    = uint16(tlstestGtEventFlagGT_F_END_BY_CLOSE)
	StatTLSCalls      = uint32(tlstestGtStatGT_STAT_TLS_CALLS)
	StatTLSEvents     = uint32(tlstestGtStatGT_STAT_TLS_EVENTS)
	StatTLSLinked     = uint32(tlstestGtStatGT_STAT_TLS_LINKED)
	StatNotHTTP       = uint32(tlstestGtStatGT_STAT_NOT_HTTP)
	StatStreamGapBody = uint32(tlstestGtStatGT_STAT_STREAM_GAP_BODY)
	StatStaleConn     = uint32(tlstestGtStatGT_STAT_STALE_CONN)
	StatStoodIn       = uint32(tlstestGtStatGT_STAT_STOOD_IN)
	StatMax           = uint32(tlstestGtStatGT_STAT_MAX)
)

// Load loads the test object into the kernel.
func Load() (*Objects, error) { return load(false) }

// LoadPinned loads it as gymtrace does where the kernel runs syscall
// programs preemptible: they hold preemption off (gt_sys_pin), and leave
// the marks their understudies read (bpf/common/understudy.h).
func LoadPinned() (*Objects, error) { return load(true) }

func load(pinned bool) (*Objects, error) {
	spec, err := loadTlstest()
	if err != nil {
		return nil, err
	}
	if pinned {
		if err := spec.Variables["gt_sys_pin"].Set(uint32(1)); err != nil {
			return nil, err
		}
	}
	// Typed as gymtrace loads its own (internal/loader), so the tests
	// attach the way it does.
	probesite.PrepareMulti(spec)
	var o Objects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%+v", ve)
		}
		return nil, err
	}
	return &o, nil
}
