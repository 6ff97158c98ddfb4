-- fixture: basic
SELECT * FROM step_params;
