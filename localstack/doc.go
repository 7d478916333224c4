// Package localstack holds vramq's local AWS setup: the queue definitions in
// queues.json, which Create applies to any SQS endpoint and which the LocalStack
// init hook (init/ready.d) and, later, the Terraform in infra/ must match; and,
// beside the Go code, the no-Docker emulator (emulator.sh, a pinned fauxqs) and
// the LocalStack compose file for those with Docker.
//
// Create talks to whatever endpoint the standard AWS configuration names
// (AWS_ENDPOINT_URL for the emulator or LocalStack, none for AWS), so the same
// tests run against all three.
package localstack
