package serving

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Serve answers what review appends, refuses what the API server never
// sends before reading it, and passes review's refusals through.
func TestServe(t *testing.T) {
	echo := func(_ *http.Request, body, dst []byte) ([]byte, error) {
		if string(body) == "refuse" {
			return nil, Refuse(http.StatusServiceUnavailable, "NoConfig", "not yet")
		}
		if string(body) == "plain error" {
			return nil, errors.New("bad review")
		}
		return append(append(dst, "got "...), body...), nil
	}
	cases := []struct {
		name, method, ctype, body string
		code                      int
		reason, answer            string
	}{
		{"ok", http.MethodPost, "application/json; charset=utf-8", "x", 200, "", "got x"},
		{"GET", http.MethodGet, "application/json", "x", 405, ReasonMethod, "method GET not allowed: POST an AdmissionReview"},
		{"no content type", http.MethodPost, "", "x", 415, ReasonContentType, `content type "" not supported: want application/json`},
		{"yaml", http.MethodPost, "text/yaml", "x", 415, ReasonContentType, `content type "text/yaml" not supported: want application/json`},
		{"refused by review", http.MethodPost, "application/json", "refuse", 503, "NoConfig", "not yet"},
		{"plain error", http.MethodPost, "application/json", "plain error", 400, ReasonRead, "bad review"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, "/x", strings.NewReader(c.body))
			if c.ctype != "" {
				r.Header.Set("Content-Type", c.ctype)
			}
			w := httptest.NewRecorder()
			be := Serve(w, r, nil, echo)
			if w.Code != c.code || strings.TrimSpace(w.Body.String()) != c.answer {
				t.Fatalf("answer %d %q, want %d %q", w.Code, w.Body.String(), c.code, c.answer)
			}
			if (be == nil) != (c.reason == "") || be != nil && be.Reason != c.reason {
				t.Fatalf("refusal %+v, want reason %q", be, c.reason)
			}
			if c.code == 200 && w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("content type %q", w.Header().Get("Content-Type"))
			}
		})
	}
}

// An answer buffer that grew past maxPooledOut is not kept.
func TestServeDropsLargeBuffers(t *testing.T) {
	big := func(_ *http.Request, _, dst []byte) ([]byte, error) {
		return append(dst, make([]byte, maxPooledOut+1)...), nil
	}
	r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader("{}"))
	r.Header.Set("Content-Type", "application/json")
	if be := Serve(httptest.NewRecorder(), r, nil, big); be != nil {
		t.Fatal(be)
	}
	for i := 0; i < 4; i++ {
		if o := outPool.Get().(*outBuf); cap(o.b) > maxPooledOut {
			t.Fatalf("pooled a %d byte buffer", cap(o.b))
		}
	}
}
