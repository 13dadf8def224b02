package grpcbridge

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// TestFixedWindowsSendNoPings speaks HTTP/2 frame by frame to a gRPC
// connection: the server announces the fixed stream window and opens the
// connection's, and answers a call's data with no ping of its own (grpc-go's
// bandwidth estimate sent a window update and a ping for the first data
// after each ping's answer: about one per keep-alive).
func TestFixedWindowsSendNoPings(t *testing.T) {
	h := start(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	must(err)
	defer conn.Close()
	must(conn.SetDeadline(time.Now().Add(10 * time.Second)))
	_, err = conn.Write([]byte(http2.ClientPreface))
	must(err)
	fr := http2.NewFramer(conn, conn)
	must(fr.WriteSettings())
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "keyshard"},
		{":path", keyshardv1connect.MemberServiceJoinProcedure},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		must(enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	must(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}))
	msg, err := proto.Marshal(&keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: "w"}})
	must(err)
	must(fr.WriteData(1, true, append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)))

	var streamWin, connOpened uint32
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's frames before the call's trailers: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				streamWin = v
			}
			must(fr.WriteSettingsAck())
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connOpened += f.Increment
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				t.Fatalf("the server pinged after the call's data: a ping per message costs a read and a write each")
			}
		case *http2.HeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() {
				if streamWin != streamWindow {
					t.Errorf("INITIAL_WINDOW_SIZE %d, want %d", streamWin, streamWindow)
				}
				// The connection's window starts at HTTP/2's 65,535.
				if want := uint32(connWindow - 65535); connOpened < want {
					t.Errorf("the connection's window opened by %d, want at least %d", connOpened, want)
				}
				return
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v before the call's trailers", f.ErrCode)
		}
	}
}

// TestMessagesPastTheWindows sends messages larger than the stream's
// window, and together larger than the connection's, at once: flow
// control lets them through as the handlers read.
func TestMessagesPastTheWindows(t *testing.T) {
	h := start(t)
	cc := h.grpcGoClient(t)
	var g errgroup.Group
	for i := range 3 {
		g.Go(func() error {
			id := fmt.Sprintf("big-%d", i)
			req := &keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: id, Address: strings.Repeat("a", 3*streamWindow)}}
			out := new(keyshardv1.JoinResponse)
			if err := cc.Invoke(t.Context(), keyshardv1connect.MemberServiceJoinProcedure, req, out); err != nil {
				return fmt.Errorf("call %d: %w", i, err)
			}
			if want := "bridge:" + id; out.GetSession() != want {
				return fmt.Errorf("call %d: session %q, want %q", i, out.GetSession(), want)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
