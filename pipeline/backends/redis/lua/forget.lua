redis.call('HDEL', P .. 'workers', ARGV[2])
return 0
