"""Generated gRPC code for the proto package `stallscope.v1`
(protos/stallscope/api/v1/stallscope.proto, made by scripts/gen_protos.sh;
never edited by hand)."""
