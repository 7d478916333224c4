package publishertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/internal/testenv/edge"
	"github.com/vramq/vramq/internal/testenv/s3front"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
)

// LargeFile is a file of a tenant's in a bucket, stored as a batch's output
// file is (publisher/batchfiles.go): its content, then its record.
type LargeFile struct {
	ID   string
	Data []byte
}

// StoreOutputFile stores size bytes of JSONL lines as owner's batch_output
// file, straight into the bucket: the Lambda mode's uploads are bounded at
// 4 MiB, but a batch's output file has no such bound.
func StoreOutputFile(t testing.TB, store *payload.Store, owner string, size int) LargeFile {
	t.Helper()
	var line bytes.Buffer
	var data []byte
	for i := 0; len(data) < size; i++ {
		line.Reset()
		fmt.Fprintf(&line, `{"id":"batch_req_%d","custom_id":"c-%d","response":{"status_code":200,"body":{"data":"%s"}},"error":null}`+"\n",
			i, i, strings.Repeat("x", 900))
		data = append(data, line.Bytes()...)
	}
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	now := time.Now()
	id := fmt.Sprintf("file-%012x%s", now.UnixMilli(), hex.EncodeToString(rnd[:]))
	rec := fmt.Sprintf(`{"v":1,"id":%q,"owner":%q,"filename":"big_output.jsonl","bytes":%d,"lines":1,"purpose":"batch_output","created_at":%d,"expires_at":%d}`,
		id, owner, len(data), now.Unix(), now.Add(time.Hour).Unix())
	if _, err := store.Put(t.Context(), job.FileKey(owner, id), data); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(t.Context(), job.FileRecordKey(owner, id), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	return LargeFile{id, data}
}

// Downloads is the environment of the large-download tests.
type Downloads struct {
	*Served   // the publisher over HTTP, its sweeper running
	Store     *payload.Store
	LambdaURL string // the publisher under Lambda behind an HTTP API
	EdgeURL   string // the edge in front of the HTTP API and the bucket; "" without
	Front     *s3front.Front
}

// LambdaDownloads is a publisher with key key-a (tenant acme) on the queue
// workURL and the bucket of store, both served over HTTP (URL) and run as a
// Lambda function behind an HTTP API (LambdaURL), whose bucket it reaches
// through an S3 front that checks presigned URLs as S3 does. With edged, an
// edge is in front of the HTTP API and the bucket (EdgeURL, the publisher's
// PublicURL), as infra/edge.tf's CloudFront distribution is: it routes the
// bucket's file keys to the front, which is path-style here
// (/{bucket}/files/...) where S3's own presigned URLs put the bucket in the
// host (/files/...).
func LambdaDownloads(t testing.TB, client *sqs.Client, workURL string, store *payload.Store, edged bool) *Downloads {
	t.Helper()
	d := &Downloads{Store: store}
	var fronted *payload.Store
	fronted, d.Front = FrontedStore(t, store)
	pc := publisher.Config{Payloads: fronted, API: publisher.API{APIKeys: []string{"acme:key-a"}}}
	var ed *edge.Edge
	if edged {
		ed = edge.Start(t, "/"+store.Bucket()+"/"+strings.SplitAfter(job.FilesPrefix("acme"), "/")[0], d.Front.URL)
		pc.PublicURL, d.EdgeURL = ed.URL, ed.URL
	}
	d.Served = Serve(t, client, workURL, store, pc)
	Sweep(t, d.Pub)
	fn := apigw.Handler(api.LambdaHandler(d.Pub.Handler()))
	lam := httptest.NewServer(fn)
	t.Cleanup(lam.Close)
	if edged {
		ed.Route(fn)
	}
	d.LambdaURL = lam.URL
	return d
}

// FrontedStore is store's bucket reached through an S3 front (the emulator's
// S3, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, behind s3front), which counts
// requests and checks presigned URLs as S3 does.
func FrontedStore(t testing.TB, store *payload.Store) (*payload.Store, *s3front.Front) {
	t.Helper()
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	cfg, err := awsconfig.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := cfg.Credentials.Retrieve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	front := s3front.Start(t, endpoint, creds)
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(front.URL), true })
	return payload.New(client, store.Bucket()), front
}
