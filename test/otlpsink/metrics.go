package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Point is one line of the metrics output in the default "points" format: one
// data point with its metric, scope and resource, in the style of Span.
// Which of the value fields are set depends on Type.
type Point struct {
	Export      int64          `json:"export"` // 1 for the first metrics Export request this sink wrote, 2 for the next...
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Unit        string         `json:"unit"`
	Type        string         `json:"type"`                  // GAUGE, SUM, HISTOGRAM, EXPONENTIAL_HISTOGRAM, SUMMARY
	Temporality string         `json:"temporality,omitempty"` // CUMULATIVE or DELTA (SUM and the histograms)
	Monotonic   *bool          `json:"monotonic,omitempty"`   // SUM only
	Start       uint64         `json:"start_time_unix_nano"`
	Time        uint64         `json:"time_unix_nano"`
	Attributes  map[string]any `json:"attributes"`
	Resource    map[string]any `json:"resource"`
	Scope       string         `json:"scope"`
	ScopeVer    string         `json:"scope_version"`
	Flags       uint32         `json:"flags"` // 1: no recorded value
	Exemplars   int            `json:"exemplars"`

	// GAUGE and SUM.
	ValueType string `json:"value_type,omitempty"` // INT or DOUBLE
	Value     any    `json:"value,omitempty"`      // int64 for INT, Num for DOUBLE

	// HISTOGRAM, EXPONENTIAL_HISTOGRAM and SUMMARY.
	Count *uint64 `json:"count,omitempty"`
	Sum   *Num    `json:"sum,omitempty"`
	Min   *Num    `json:"min,omitempty"`
	Max   *Num    `json:"max,omitempty"`

	// HISTOGRAM: bucket i counts values in (bounds[i-1], bounds[i]], the last one above every bound.
	BucketCounts   []uint64 `json:"bucket_counts,omitempty"`
	ExplicitBounds []Num    `json:"explicit_bounds,omitempty"`

	// EXPONENTIAL_HISTOGRAM.
	Scale     *int32      `json:"scale,omitempty"`
	ZeroCount *uint64     `json:"zero_count,omitempty"`
	Positive  *ExpBuckets `json:"positive,omitempty"`
	Negative  *ExpBuckets `json:"negative,omitempty"`

	// SUMMARY.
	Quantiles []Quantile `json:"quantiles,omitempty"`
}

// ExpBuckets is one side of an exponential histogram.
type ExpBuckets struct {
	Offset       int32    `json:"offset"`
	BucketCounts []uint64 `json:"bucket_counts"`
}

// Quantile is one summary quantile.
type Quantile struct {
	Quantile Num `json:"quantile"`
	Value    Num `json:"value"`
}

// Num is a float64 that survives JSON: finite values are numbers (shortest
// form that reads back exactly), NaN and infinities the strings "NaN",
// "+Inf" and "-Inf" (encoding/json refuses them as numbers).
type Num float64

func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

func (n *Num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*n = Num(math.NaN())
		return nil
	case `"+Inf"`:
		*n = Num(math.Inf(1))
		return nil
	case `"-Inf"`:
		*n = Num(math.Inf(-1))
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("not a number: %s", b)
	}
	*n = Num(f)
	return nil
}

// metricsService is the OTLP metrics service on the sink's listener (its own
// type: the sink itself is the trace service, and both methods are Export).
type metricsService struct {
	pmetricotlp.UnimplementedGRPCServer
	s *sink
}

// Export implements the OTLP metrics service: like the trace service, the
// request's points are written with one write before it is answered.
func (m *metricsService) Export(ctx context.Context, req pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	s := m.s
	md := req.Metrics()
	n := md.DataPointCount()
	if err := s.admit(ctx, &s.metricRejected, "data_points", n); err != nil {
		return pmetricotlp.NewExportResponse(), err
	}
	if s.opts.metricsOut == nil { // counting only
		s.metricRequests.Add(1)
		s.dataPoints.Add(int64(n))
		return pmetricotlp.NewExportResponse(), nil
	}
	s.metricsMu.Lock()
	defer s.metricsMu.Unlock()
	seq := s.exports + 1
	var buf []byte
	var err error
	if s.opts.metricsFormat == "otlp" {
		buf, err = (&pmetric.JSONMarshaler{}).MarshalMetrics(md)
		buf = append(buf, '\n')
	} else {
		buf, err = encodePoints(md, seq)
	}
	if err != nil {
		return pmetricotlp.NewExportResponse(), status.Errorf(codes.Internal, "otlpsink: encoding metrics: %v", err)
	}
	if _, err := s.opts.metricsOut.Write(buf); err != nil {
		s.opts.logger.Error("writing metrics failed", "err", err)
		return pmetricotlp.NewExportResponse(), status.Errorf(codes.Internal, "otlpsink: writing metrics: %v", err)
	}
	s.exports = seq
	s.metricRequests.Add(1)
	s.dataPoints.Add(int64(n))
	s.opts.logger.Info("metrics export received", "data_points", n)
	return pmetricotlp.NewExportResponse(), nil
}

// encodePoints renders every data point of one request as one JSON line.
func encodePoints(md pmetric.Metrics, seq int64) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		rm := rms.At(i)
		res := rm.Resource().Attributes().AsRaw()
		sms := rm.ScopeMetrics()
		for j := 0; j < sms.Len(); j++ {
			sm := sms.At(j)
			ms := sm.Metrics()
			for k := 0; k < ms.Len(); k++ {
				for _, p := range metricPoints(ms.At(k)) {
					p.Export, p.Resource, p.Scope, p.ScopeVer = seq, res, sm.Scope().Name(), sm.Scope().Version()
					if err := enc.Encode(p); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return buf.Bytes(), nil
}

func metricPoints(m pmetric.Metric) []Point {
	base := Point{Name: m.Name(), Description: m.Description(), Unit: m.Unit(), Type: typeName(m.Type())}
	var out []Point
	common := func(attrs pcommon.Map, start, ts pcommon.Timestamp, flags pmetric.DataPointFlags, exemplars int) Point {
		p := base
		p.Attributes, p.Start, p.Time, p.Exemplars = attrs.AsRaw(), uint64(start), uint64(ts), exemplars
		if flags.NoRecordedValue() {
			p.Flags = 1
		}
		return p
	}
	number := func(dps pmetric.NumberDataPointSlice, temporality string, monotonic *bool) {
		for i := 0; i < dps.Len(); i++ {
			dp := dps.At(i)
			p := common(dp.Attributes(), dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), dp.Exemplars().Len())
			p.Temporality, p.Monotonic = temporality, monotonic
			switch dp.ValueType() {
			case pmetric.NumberDataPointValueTypeInt:
				p.ValueType, p.Value = "INT", dp.IntValue()
			case pmetric.NumberDataPointValueTypeDouble:
				p.ValueType, p.Value = "DOUBLE", Num(dp.DoubleValue())
			}
			out = append(out, p)
		}
	}
	switch m.Type() {
	case pmetric.MetricTypeGauge:
		number(m.Gauge().DataPoints(), "", nil)
	case pmetric.MetricTypeSum:
		mono := m.Sum().IsMonotonic()
		number(m.Sum().DataPoints(), temporalityName(m.Sum().AggregationTemporality()), &mono)
	case pmetric.MetricTypeHistogram:
		dps := m.Histogram().DataPoints()
		for i := 0; i < dps.Len(); i++ {
			dp := dps.At(i)
			p := common(dp.Attributes(), dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), dp.Exemplars().Len())
			p.Temporality = temporalityName(m.Histogram().AggregationTemporality())
			p.Count = ptr(dp.Count())
			if dp.HasSum() {
				p.Sum = ptr(Num(dp.Sum()))
			}
			if dp.HasMin() {
				p.Min = ptr(Num(dp.Min()))
			}
			if dp.HasMax() {
				p.Max = ptr(Num(dp.Max()))
			}
			p.BucketCounts = append([]uint64{}, dp.BucketCounts().AsRaw()...)
			p.ExplicitBounds = []Num{}
			for _, b := range dp.ExplicitBounds().AsRaw() {
				p.ExplicitBounds = append(p.ExplicitBounds, Num(b))
			}
			out = append(out, p)
		}
	case pmetric.MetricTypeExponentialHistogram:
		dps := m.ExponentialHistogram().DataPoints()
		for i := 0; i < dps.Len(); i++ {
			dp := dps.At(i)
			p := common(dp.Attributes(), dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), dp.Exemplars().Len())
			p.Temporality = temporalityName(m.ExponentialHistogram().AggregationTemporality())
			p.Count, p.Scale, p.ZeroCount = ptr(dp.Count()), ptr(dp.Scale()), ptr(dp.ZeroCount())
			if dp.HasSum() {
				p.Sum = ptr(Num(dp.Sum()))
			}
			if dp.HasMin() {
				p.Min = ptr(Num(dp.Min()))
			}
			if dp.HasMax() {
				p.Max = ptr(Num(dp.Max()))
			}
			p.Positive = &ExpBuckets{Offset: dp.Positive().Offset(), BucketCounts: append([]uint64{}, dp.Positive().BucketCounts().AsRaw()...)}
			p.Negative = &ExpBuckets{Offset: dp.Negative().Offset(), BucketCounts: append([]uint64{}, dp.Negative().BucketCounts().AsRaw()...)}
			out = append(out, p)
		}
	case pmetric.MetricTypeSummary:
		dps := m.Summary().DataPoints()
		for i := 0; i < dps.Len(); i++ {
			dp := dps.At(i)
			p := common(dp.Attributes(), dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), 0)
			p.Count, p.Sum = ptr(dp.Count()), ptr(Num(dp.Sum()))
			p.Quantiles = []Quantile{}
			qs := dp.QuantileValues()
			for q := 0; q < qs.Len(); q++ {
				p.Quantiles = append(p.Quantiles, Quantile{Quantile: Num(qs.At(q).Quantile()), Value: Num(qs.At(q).Value())})
			}
			out = append(out, p)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// typeName is GAUGE, SUM, HISTOGRAM, EXPONENTIAL_HISTOGRAM, SUMMARY (EMPTY for none).
func typeName(t pmetric.MetricType) string {
	if t == pmetric.MetricTypeExponentialHistogram {
		return "EXPONENTIAL_HISTOGRAM"
	}
	return strings.ToUpper(t.String())
}

func temporalityName(t pmetric.AggregationTemporality) string {
	switch t {
	case pmetric.AggregationTemporalityCumulative:
		return "CUMULATIVE"
	case pmetric.AggregationTemporalityDelta:
		return "DELTA"
	default:
		return "UNSPECIFIED"
	}
}
