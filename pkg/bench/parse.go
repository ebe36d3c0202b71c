package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// ParseIperf3 returns the throughput in Gbit/s from the JSON report of an
// iperf3 client run (`iperf3 -c ... -J`). It prefers the receiver's view
// (end.sum_received) and falls back to the sender's.
func ParseIperf3(data []byte) (float64, error) {
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived *struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent *struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_sent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return 0, fmt.Errorf("parse iperf3 json: %w", err)
	}
	if rep.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", rep.Error)
	}
	switch {
	case rep.End.SumReceived != nil && rep.End.SumReceived.BitsPerSecond > 0:
		return rep.End.SumReceived.BitsPerSecond / 1e9, nil
	case rep.End.SumSent != nil && rep.End.SumSent.BitsPerSecond > 0:
		return rep.End.SumSent.BitsPerSecond / 1e9, nil
	}
	return 0, errors.New("parse iperf3 json: no end.sum_received or end.sum_sent")
}

// Latency is the request/response time distribution of a ping-pong run, µs.
type Latency struct {
	P50, P99     float64
	Observations int
	// Received: the round trips of the whole run, warm-up included
	// (sockperf's "[Total Run] ... ReceivedMessages"); 0 if not printed.
	Received int
}

var (
	ansiRe = regexp.MustCompile("\x1b\\[[0-9;]*m")
	pctRe  = regexp.MustCompile(`percentile\s+([0-9.]+)\s*=\s*([0-9.]+)`)
	obsRe  = regexp.MustCompile(`Total\s+([0-9]+)\s+observations`)
	rcvdRe = regexp.MustCompile(`\[Total Run\][^\n]*ReceivedMessages=([0-9]+)`)
)

// ParseSockperf reads the percentile lines of `sockperf ping-pong` output
// (run with --full-rtt, so values are round trips in µs).
func ParseSockperf(out []byte) (Latency, error) {
	text := ansiRe.ReplaceAll(out, nil)
	var lat Latency
	found := 0
	for _, m := range pctRe.FindAllSubmatch(text, -1) {
		p, err1 := strconv.ParseFloat(string(m[1]), 64)
		v, err2 := strconv.ParseFloat(string(m[2]), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		switch p {
		case 50:
			lat.P50 = v
			found |= 1
		case 99:
			lat.P99 = v
			found |= 2
		}
	}
	if found != 3 {
		return Latency{}, errors.New("parse sockperf output: percentile 50 or 99 missing")
	}
	if m := obsRe.FindSubmatch(text); m != nil {
		lat.Observations, _ = strconv.Atoi(string(m[1]))
	}
	if m := rcvdRe.FindSubmatch(text); m != nil {
		lat.Received, _ = strconv.Atoi(string(m[1]))
	}
	return lat, nil
}
