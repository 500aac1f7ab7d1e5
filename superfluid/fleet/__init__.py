"""The fleet: a head daemon places sessions on node agents over Link F."""
