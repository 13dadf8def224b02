package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// call makes one HTTP request with the admin token and returns the status
// and the decoded JSON error body (zero if the body is not one).
func call(t *testing.T, method, url, contentType, body string) (int, struct{ Code, Message string }) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var e struct{ Code, Message string }
	if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK && (ct != "application/json" || json.Unmarshal(raw, &e) != nil) {
		t.Errorf("%s %s: status %d, %s %q: not a JSON error body", method, url, res.StatusCode, ct, raw)
	}
	return res.StatusCode, e
}

// TestStrictInputOverHTTP: JSON requests with unknown fields or enum
// names, or malformed values, are refused naming the field; both name
// styles are accepted.
func TestStrictInputOverHTTP(t *testing.T) {
	ts := startServer(t, nil)
	create := ts.url + keyshardv1connect.AdminServiceCreateKeyspaceProcedure
	for _, tc := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"keyspace":{"name":"a","bucket":16}}`, 400, `keyspace.bucket: unknown field; did you mean "buckets"?`},
		{`{"keyspace":{"name":"a","mode":"NOPE"}}`, 400, `keyspace.mode: "NOPE" is not a KeyspaceMode; want one of KEYSPACE_MODE_UNSPECIFIED, KEYSPACE_MODE_EXCLUSIVE, KEYSPACE_MODE_STREAM`},
		{`{"keyspace":{"name":"a","leaseTtl":"1000h"}}`, 400, `keyspace.lease_ttl: "1000h" is not accepted (1000h is "3600000s"); want a duration in seconds with an "s" suffix, like "10s"`},
		{`{"keyspace":{"name":"camel","buckets":16,"leaseTtl":"10s","drainTimeout":"30s"}}`, 200, ""},
		{`{"keyspace":{"name":"snake","buckets":16,"lease_ttl":"10s","drain_timeout":"30s"}}`, 200, ""},
	} {
		status, e := call(t, http.MethodPost, create, "application/json", tc.body)
		if status != tc.status || !strings.Contains(e.Message, tc.msg) || (status != 200 && e.Code != "invalid_argument") {
			t.Errorf("%s: %d %+v, want %d with %q", tc.body, status, e, tc.status, tc.msg)
		}
	}
}

// TestPlainStatusesHaveJSONBodies: 404, 405 and 415 answers carry the
// JSON error body of every other error, saying what to send instead.
func TestPlainStatusesHaveJSONBodies(t *testing.T) {
	ts := startServer(t, nil)
	for _, tc := range []struct {
		method, path, ctype, body string
		status                    int
		msg                       string
	}{
		{"POST", "/keyshard.v1.AdminService/CreateKeyspaces", "application/json", "{}", 404, `keyshard.v1.AdminService has no method "CreateKeyspaces"; it has CreateKeyspace, GetKeyspace`},
		{"POST", "/keyshard.v2.Nope/Do", "application/json", "{}", 404, "no such path: /keyshard.v2.Nope/Do; the API is POST /<service>/<method> with services keyshard.v1.AdminService"},
		{"GET", "/nothing-here", "", "", 404, "no such path: /nothing-here"},
		{"PUT", keyshardv1connect.AdminServiceCreateKeyspaceProcedure, "application/json", "{}", 405, "PUT /keyshard.v1.AdminService/CreateKeyspace: HTTP method not allowed; use POST"},
		{"POST", keyshardv1connect.AdminServiceCreateKeyspaceProcedure, "application/x-www-form-urlencoded", "{}", 415, `Content-Type "application/x-www-form-urlencoded" is not served; send "application/json"`},
	} {
		status, e := call(t, tc.method, ts.url+tc.path, tc.ctype, tc.body)
		if status != tc.status || e.Code != "unimplemented" || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s %s: %d %+v, want %d unimplemented with %q", tc.method, tc.path, status, e, tc.status, tc.msg)
		}
	}
}
