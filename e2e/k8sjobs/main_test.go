package k8sjobs

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// minParallel is how many cases may run at once. They spend their time
// waiting for the cluster (a minute boundary for the CronJobs, the control's
// window, pilot-agent's drain, the kubelet's back-off), not computing, so
// go test's default of GOMAXPROCS (2 on CI) would only serialise the waits.
const minParallel = 16

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit && runtime.GOMAXPROCS(0) < minParallel {
		if err := flag.Set("test.parallel", strconv.Itoa(minParallel)); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
