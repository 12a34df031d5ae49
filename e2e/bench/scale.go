package main

import (
	"context"
	"log"
)

// scalePoint is one pod shape of the pod-level scale runs.
type scalePoint struct {
	procs int // processes in the pod (0: as few as the pod has)
	apps  int // app containers
}

// scaleProcs and scaleApps are the pod shapes measured.
var (
	scaleProcs = []int{10, 1000, 10000}
	scaleApps  = []int{1, 10, 50}
)

// podScale runs the supervisor (pidfd) in pods of growing size: its CPU
// time until it watches every app, the wall time to that point, and the
// exit-to-stop latency, which includes the stop's scan for sidecars.
func podScale(ctx context.Context, e env, runs int) map[scalePoint]*stopLatency {
	out := map[scalePoint]*stopLatency{}
	var points []scalePoint
	for _, n := range scaleProcs {
		points = append(points, scalePoint{procs: n, apps: 1})
	}
	for _, a := range scaleApps[1:] {
		points = append(points, scalePoint{apps: a})
	}
	for _, pt := range points {
		s := &stopLatency{}
		out[pt] = s
		for i := 0; i < runs; i++ {
			r, err := runOnce(ctx, e, podOpts{method: pidfd, procs: pt.procs, apps: pt.apps})
			s.add(r, err)
			if err != nil {
				log.Printf("scale %+v run %d: %v", pt, i, err)
			}
		}
		log.Printf("scale: %+v done", pt)
	}
	return out
}
