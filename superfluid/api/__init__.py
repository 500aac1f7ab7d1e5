"""HTTP APIs: translation onto GenRequest and from Chunks. Never imports sched/runtime/worker."""
