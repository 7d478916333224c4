// Package testenv is the root of the harness that vramq's tests, and the
// tools that drive them (loadgen, soak, bench), share: an SQS/S3 endpoint
// under test (sqstest), a local Lambda runtime (lambdart), fault injection
// (faultproxy), the run's accounting (accounting), work and results over SQS
// (jobq), synthetic workloads (workload), process memory (procmem), the
// emulated GPU (cudaemu), an OpenAI-compatible model server (fakeoai), the
// check of docs/configuration.md's generated flag tables (configdoc), and the
// small helpers many tests share: polling a condition (wait), summing a
// registry's series (promsum), comparing float slices (floats), API Gateway
// events and an HTTP API in front of a Lambda handler (apigw), and an S3
// front that counts reads and checks presigned URLs as S3 does (s3front),
// and the CloudFront edge that puts the API and the bucket on one origin
// (edge).
// Nothing under it ships: the rest of internal/ is what the publisher and
// subscriber binaries link, and TestNotShipped keeps it so.
package testenv
