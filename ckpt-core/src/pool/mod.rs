//! The node buffer pool (WAG-DBI).
