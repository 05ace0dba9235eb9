package s3_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spore-run/spore/internal/blob/s3"
	"github.com/spore-run/spore/internal/testenv"
)

// Throughput of 64 MiB objects against versitygw on loopback, the store
// beside raw presigned PUT/GET with plain net/http (what the server does
// without the SDK):
//
//	go test -run '^$' -bench . -benchtime 10x ./internal/blob/s3/

const benchSize = 64 << 20

func benchData() []byte {
	b := make([]byte, benchSize)
	rand.NewChaCha8([32]byte{1}).Read(b)
	return b
}

// plain hides bytes.Reader's Seek: callers stream, as the chunk layer does.
type plain struct{ io.Reader }

func BenchmarkStorePut(b *testing.B) {
	benchPut(b)
}

// Above the multipart threshold: 16 MiB parts, each buffered and signed.
func BenchmarkStorePutMultipart(b *testing.B) {
	benchPut(b, func(c *s3.Config) { c.MultipartThreshold = 32 << 20 })
}

func benchPut(b *testing.B, edit ...func(*s3.Config)) {
	srv := testenv.S3(b)
	s := open(b, srv, false, edit...)
	data := benchData()
	b.SetBytes(benchSize)
	for b.Loop() {
		if err := s.Put(b.Context(), "bench/obj", plain{bytes.NewReader(data)}, benchSize); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStoreGet(b *testing.B) {
	srv := testenv.S3(b)
	s := open(b, srv, false)
	data := benchData()
	if err := s.Put(b.Context(), "bench/obj", bytes.NewReader(data), benchSize); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSize)
	for b.Loop() {
		rc, err := s.Get(b.Context(), "bench/obj")
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, rc); err != nil || n != benchSize {
			b.Fatalf("read %d bytes: %v", n, err)
		}
		rc.Close()
	}
}

func presign(b *testing.B, srv *testenv.S3Server) (*s3.Store, *awss3.PresignClient) {
	s := open(b, srv, false)
	return s, awss3.NewPresignClient(s.Client(), awss3.WithPresignExpires(time.Hour))
}

func BenchmarkRawPut(b *testing.B) {
	srv := testenv.S3(b)
	_, p := presign(b, srv)
	data := benchData()
	req, err := p.PresignPutObject(b.Context(), &awss3.PutObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("bench/raw")})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSize)
	for b.Loop() {
		r, _ := http.NewRequestWithContext(b.Context(), http.MethodPut, req.URL, plain{bytes.NewReader(data)})
		r.ContentLength = benchSize
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("presigned PUT: %s", resp.Status)
		}
	}
}

func BenchmarkRawGet(b *testing.B) {
	srv := testenv.S3(b)
	s, p := presign(b, srv)
	if err := s.Put(b.Context(), "bench/raw", bytes.NewReader(benchData()), benchSize); err != nil {
		b.Fatal(err)
	}
	req, err := p.PresignGetObject(b.Context(), &awss3.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("bench/raw")})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSize)
	for b.Loop() {
		resp, err := http.Get(req.URL)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != benchSize || resp.StatusCode != http.StatusOK {
			b.Fatalf("presigned GET: %s, %d bytes, %v", resp.Status, n, err)
		}
	}
}
