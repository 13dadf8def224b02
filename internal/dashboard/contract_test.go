package dashboard_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/keyshard/keyshard/internal/dashboard"
)

// TestDashboardContract runs the page against canned answers of the calls
// branch ui-api adds (GetBuckets, GetKeyspaceHistory, GetHotKeyReports,
// Status.replicas/store, KeyspaceStatus.draining_members/
// releasing_buckets, MemberStatus.lease_left), in the JSON the brief's
// contract gives, so the page's use of them is checked before a server
// answers them. Once ui-api is merged, TestDashboard covers them against
// a real server too.
func TestDashboardContract(t *testing.T) {
	if testing.Short() {
		t.Skip("runs chromium; skipped with -short")
	}
	p := newPage(t)
	now := time.Now().UTC().Format(time.RFC3339)
	answers := map[string]string{
		"AdminService/Status": `{"replica":"r1","leader":"r2","replicas":[{"id":"r1","url":"http://r1:7400"},{"id":"r2","url":"http://r2:7400","leader":true}],
			"store":{"healthy":true,"endpoints":["http://etcd-1:2379"],"dbSizeBytes":"2097152","revision":"812","latency":"0.003s"},
			"keyspaces":[{"keyspace":{"name":"rooms","buckets":8,"mode":"KEYSPACE_MODE_STREAM"},"epoch":"9","members":2,"handoffsInFlight":2,"drainingMembers":1,"releasingBuckets":1,"membersWithoutBuckets":3}]}`,
		"AdminService/ListHotKeyPools":      `{"pools":[{"name":"ingest","threshold":100}]}`,
		"HotKeyService/GetOverflowSet":      `{"set":{"pool":"ingest","version":"3","keys":[{"key":"token:abc","rate":1702,"since":"` + now + `"}]},"changed":true}`,
		"TenantPoolService/ListTenantPools": `{"pools":[{"pool":{"name":"gateways"},"members":3,"tenants":12,"version":"4"}]}`,
		"MapService/GetMap":                 `{"map":{"keyspace":"rooms","epoch":"9","buckets":8,"members":[{"id":"a"},{"id":"b"}],"owners":[1,1,1,1,2,2,2,2]},"changed":true}`,
		"AdminService/ListMembers": `{"epoch":"9","members":[
			{"member":{"id":"a","address":"a:1","weight":1,"zone":"z1"},"targetBuckets":4,"grantedBuckets":5,"releasingBuckets":1,"leaseLeft":"7.250s"},
			{"member":{"id":"b","address":"b:1","weight":2,"zone":"z2"},"targetBuckets":4,"grantedBuckets":2,"draining":true,"leaseLeft":"3s"}]}`,
		// buckets 0-3 granted to a; 4 releasing (a holds it, b owns it);
		// 5 awaiting grant; 6-7 granted to b.
		"AdminService/GetBuckets": `{"epoch":"9","buckets":8,"members":["a","b"],"stream":true,"runs":[
			{"first":0,"count":4,"owner":1,"holder":1,"token":"11","state":"BUCKET_STATE_GRANTED","position":"100"},
			{"first":4,"count":1,"owner":2,"holder":1,"token":"11","state":"BUCKET_STATE_RELEASING","position":"42"},
			{"first":5,"count":1,"owner":2,"state":"BUCKET_STATE_AWAITING_GRANT","position":"7"},
			{"first":6,"count":2,"owner":2,"holder":2,"token":"12","state":"BUCKET_STATE_GRANTED","position":"5"}]}`,
		"AdminService/GetKeyspaceHistory": `{"changes":[
			{"epoch":"9","time":"` + now + `","reason":"MOVE_REASON_DRAIN","members":["b"],"movedBuckets":2,"moves":[{"from":"a","to":"b","buckets":2}]},
			{"epoch":"8","time":"` + now + `","reason":"MOVE_REASON_JOIN","members":["b"],"movedBuckets":4,"moves":[{"from":"a","to":"b","buckets":4}]},
			{"epoch":"1","time":"` + now + `","reason":"MOVE_REASON_CREATE","movedBuckets":8,"moves":[{"to":"a","buckets":8}]}]}`,
		"AdminService/GetHotKeyReports": `{"reports":[{"producer":"ingest-1","time":"` + now + `","keys":[{"key":"token:abc","rate":900},{"key":"token:def","rate":30}]},
			{"producer":"ingest-2","time":"` + now + `","keys":[{"key":"token:abc","rate":802}]}]}`,
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", dashboard.Handler())
	quit := make(chan struct{})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		method, ok := strings.CutPrefix(r.URL.Path, "/keyshard.v1.")
		if !ok {
			http.NotFound(w, r)
			return
		}
		var req map[string]any
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, `{"code":"invalid_argument","message":"not JSON"}`, http.StatusBadRequest)
			return
		}
		ans, ok := answers[method]
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusNotImplemented)
			fmt.Fprintf(w, `{"code":"unimplemented","message":"%s is not implemented"}`, method)
			return
		}
		if _, poll := req["wait"]; poll {
			// A long poll with nothing new: answer when the page leaves.
			select {
			case <-r.Context().Done():
			case <-quit:
			}
			return
		}
		io.WriteString(w, ans)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { close(quit); srv.Close() })

	p.run("the overview", 15*time.Second, chromedp.Navigate(srv.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#ov-store`)))
	p.waitJS("replicas, store, draining and releasing", 5*time.Second, `(() => {
		const t = document.querySelector('#view').innerText;
		return t.includes('http://r2:7400') && t.includes('leader') && t.includes('healthy') && t.includes('2.0 MiB') && t.includes('revision 812') && t.includes('read 3.0 ms')
			&& document.querySelector('#keyspaces tr[data-keyspace="rooms"]').innerText.replace(/\s+/g, ' ').includes('9 2 0 2 1 1 3');
	})()`)
	p.screenshot("contract-overview")

	p.run("the keyspace", 15*time.Second, chromedp.Navigate(srv.URL+"/ui/#/keyspace/rooms"), chromedp.WaitVisible(chromedp.CSS(`#history-table`)))
	p.waitJS("bucket states from GetBuckets", 5*time.Second,
		`document.querySelector('[data-releasing]').dataset.releasing === '1' && document.querySelector('[data-awaiting]').dataset.awaiting === '1'`)
	p.waitJS("lease left and counts", 5*time.Second, `(() => {
		const a = document.querySelector('#members-table tr[data-member="a"]').innerText.replace(/\s+/g, ' ');
		const b = document.querySelector('#members-table tr[data-member="b"]');
		return a.includes('7.3s') && a.includes('4 5 1') && b.dataset.draining === 'true' && b.querySelector('button[data-drain]').disabled;
	})()`)
	p.waitJS("the history, newest first", 5*time.Second, `(() => {
		const rows = [...document.querySelectorAll('#history-table tr[data-epoch]')];
		return rows.map(r => r.dataset.epoch).join() === '9,8,1' && rows[0].innerText.includes('drain') && rows[0].innerText.includes('a → b: 2')
			&& rows[2].innerText.includes('(unassigned) → a: 8');
	})()`)
	// Bucket 4 (row 1, column 1 of a 3×3 grid) is releasing: its tooltip
	// names the holder, the token and, in a stream keyspace, the position.
	box := evalJS[[]float64](p, `(() => { const r = document.querySelector('#grid').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()`)
	p.run("hover bucket 4", 5*time.Second, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box[0]+box[2]/2, box[1]+box[3]/2))
	p.waitJS("the tooltip of bucket 4", 5*time.Second, `(() => { const t = document.querySelector('#tooltip').textContent;
		return t.startsWith('bucket 4') && t.includes('owner  b') && t.includes('state  releasing') && t.includes('holder a') && t.includes('token  11') && t.includes('position 42'); })()`)
	p.screenshot("contract-keyspace")

	p.run("the hot keys", 15*time.Second, chromedp.Navigate(srv.URL+"/ui/#/hotkeys/ingest"), chromedp.WaitVisible(chromedp.CSS(`#reports-table`)))
	p.waitJS("the overflow set and the reports", 5*time.Second, `(() => { const t = document.querySelector('#view').innerText;
		return !!document.querySelector('#overflow-table tr[data-key="token:abc"]') && t.includes('1,702/s') && t.includes('ingest-2') && t.includes('token:def 30/s'); })()`)
	p.screenshot("contract-hotkeys")
}
