"""Reading a torch.distributed job from outside it (`commviz attach`): its ranks from
their environment (discover), their stacks (pyspy), NCCL's RAS service (ras), and
what was seen as the events the model reads (look)."""
