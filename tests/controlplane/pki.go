package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of the certificates and keys one control plane uses.
type pki struct {
	caCert, caPEM                string
	servingCert, servingKey      string
	serviceAccountKey, tokenFile string
}

// writePKI makes a throwaway CA, a serving certificate for 127.0.0.1/localhost signed by
// it, a service-account signing key and the static token file with the admin token.
func writePKI(dir string) (*pki, error) {
	certDir := filepath.Join(dir, "pki")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	out := &pki{
		caCert:            filepath.Join(certDir, "ca.crt"),
		servingCert:       filepath.Join(certDir, "apiserver.crt"),
		servingKey:        filepath.Join(certDir, "apiserver.key"),
		serviceAccountKey: filepath.Join(certDir, "service-account.key"),
		tokenFile:         filepath.Join(certDir, "tokens.csv"),
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "wasm-provisioner-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caParsed, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	out.caPEM = string(caPEM)
	if err := os.WriteFile(out.caCert, caPEM, 0o600); err != nil {
		return nil, err
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, caParsed, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(out.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER}), 0o600); err != nil {
		return nil, err
	}
	if err := writeECKey(out.servingKey, servingKey); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saDER := x509.MarshalPKCS1PrivateKey(saKey)
	if err := os.WriteFile(out.serviceAccountKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		return nil, err
	}

	// token,user,uid,"group1,group2"
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n", adminToken)
	if err := os.WriteFile(out.tokenFile, []byte(tokens), 0o600); err != nil {
		return nil, err
	}
	return out, nil
}

func writeECKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// writeKubeconfig writes an admin kubeconfig for the API server at url.
func writeKubeconfig(path, url, caPEM string) error {
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: wasm-provisioner-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: wasm-provisioner-test
  context:
    cluster: wasm-provisioner-test
    user: admin
    namespace: default
current-context: wasm-provisioner-test
`, url, base64.StdEncoding.EncodeToString([]byte(caPEM)), adminToken)
	return os.WriteFile(path, []byte(config), 0o600)
}
