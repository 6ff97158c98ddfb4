-- fixture: gc
SELECT * FROM gc_advice;
