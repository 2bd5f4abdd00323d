package testbpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Objects are the loaded programs and maps.
type Objects = injtestObjects

// Event is a ring-buffer record (struct http_event).
type Event = injtestHttpEvent

type (
	Config = injtestGtConfig
	Target = injtestGtTarget
)

// Contract values the tests check.
const (
	EvRequest       = uint8(injtestGtEventKindGT_EV_REQUEST)
	EvResponse      = uint8(injtestGtEventKindGT_EV_RESPONSE)
	FlagTraceparent = uint16(injtestGtEventFlagGT_F_TRACEPARENT)
	FlagInjected    = uint16(injtestGtEventFlagGT_F_INJECTED)
	FlagChunked     = uint16(injtestGtEventFlagGT_F_CHUNKED)
	GroupHTTPClient = uint64(1) << 2
	GroupServer     = uint64(1) << 1

	InjOn = uint32(injtestGtInjectCfgFlagGT_INJ_ON)

	StatPrepared  = uint32(injtestGtInjectStatGT_INJ_STAT_PREPARED)
	StatPushed    = uint32(injtestGtInjectStatGT_INJ_STAT_PUSHED)
	StatInjected  = uint32(injtestGtInjectStatGT_INJ_STAT_INJECTED)
	StatMiss      = uint32(injtestGtInjectStatGT_INJ_STAT_MISS)
	StatHasTP     = uint32(injtestGtInjectStatGT_INJ_STAT_HAS_TP)
	StatSplit     = uint32(injtestGtInjectStatGT_INJ_STAT_SPLIT)
	StatRoot      = uint32(injtestGtInjectStatGT_INJ_STAT_ROOT)
	StatNotPushed = uint32(injtestGtInjectStatGT_INJ_STAT_NOT_PUSHED)
	StatPushFail  = uint32(injtestGtInjectStatGT_INJ_STAT_PUSH_FAIL)
	StatSocks     = uint32(injtestGtInjectStatGT_INJ_STAT_SOCKS)
	StatSockFail  = uint32(injtestGtInjectStatGT_INJ_STAT_SOCK_FAIL)
	StatMax       = uint32(injtestGtInjectStatGT_INJ_STAT_MAX)
)

// Load loads the test object into the kernel.
func Load() (*Objects, error) {
	var o Objects
	if err := loadInjtestObjects(&o, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%+v", ve)
		}
		return nil, err
	}
	return &o, nil
}
