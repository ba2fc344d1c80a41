package main

import (
	"net/http"
	"strings"
	"testing"
)

// The verbs and resources are the host's (host/src/client.rs's verb_and_resource).
func TestVerbAndResource(t *testing.T) {
	cases := []struct{ method, path, watch, verb, resource string }{
		{http.MethodGet, "/api/v1/persistentvolumes", "", "list", "persistentvolumes"},
		{http.MethodGet, "/api/v1/persistentvolumes", "true", "watch", "persistentvolumes"},
		{http.MethodGet, "/api/v1/persistentvolumes/pvc-1", "", "get", "persistentvolumes"},
		{http.MethodPost, "/api/v1/namespaces/ns/events", "", "create", "events"},
		{http.MethodPatch, "/api/v1/namespaces/ns/events/e", "", "patch", "events"},
		{http.MethodPut, "/api/v1/namespaces/ns/persistentvolumeclaims/c/status", "", "update", "persistentvolumeclaims/status"},
		{http.MethodDelete, "/api/v1/persistentvolumes/pvc-1", "", "delete", "persistentvolumes"},
		{http.MethodDelete, "/api/v1/persistentvolumes", "", "deletecollection", "persistentvolumes"},
		{http.MethodGet, "/apis/storage.k8s.io/v1/storageclasses", "", "list", "storageclasses"},
		{http.MethodGet, "/version", "", "", "/version"},
	}
	for _, c := range cases {
		verb, resource := verbAndResource(c.method, c.path, c.watch)
		if verb != c.verb || resource != c.resource {
			t.Errorf("%s %s: %q %q, want %q %q", c.method, c.path, verb, resource, c.verb, c.resource)
		}
	}
}

func TestRender(t *testing.T) {
	c := &counts{byKey: map[[3]string]uint64{}}
	c.add("create", "persistentvolumes", "201")
	c.add("create", "persistentvolumes", "201")
	want := `wasm_provisioner_kube_api_requests_total{code="201",resource="persistentvolumes",verb="create"} 2`
	if !strings.Contains(c.render(), want+"\n") {
		t.Errorf("render:\n%s\nwant a line %s", c.render(), want)
	}
}
