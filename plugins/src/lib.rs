//! Integrations with launchers and applications (mpirun, libckpt). Empty until the coordinator issue.
