SELECT customer, COUNT(*) AS orders, SUM(amount) AS total
FROM shop.order_lines
GROUP BY customer
