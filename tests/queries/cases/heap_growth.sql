-- fixture: gc
SELECT * FROM heap_growth;
