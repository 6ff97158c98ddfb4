"""The named SQL views (one topic per `<area>/NN_topic.sql` file), shipped as
the data package `stallscope.queries`; `stallscope.store.views` loads them."""
