terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # As the module's versions.tf: 6.8.0 is the first to accept 1 MiB queues.
      version = ">= 6.8.0, < 7.0.0"
    }
  }
}
