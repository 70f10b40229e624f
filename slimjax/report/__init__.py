"""The report floor: figures from stores (``figures``) and one self-contained HTML page (``page``)."""
