package keyshardtest

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Metric returns the value of the unlabelled Prometheus series name that
// the keyshard serve at url exposes on /metrics; it fails tb if the
// series is absent or not a number.
func Metric(tb testing.TB, url, name string) float64 {
	tb.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	tb.Fatalf("no series %s on %s/metrics", name, url)
	return 0
}
