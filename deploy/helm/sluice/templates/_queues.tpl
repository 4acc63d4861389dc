{{/*
Queue names, as tasks.Layout.Queue makes them: "<queue>.<lane>.<shard>", with a
"-K" suffix where one is needed to put the name's Redis Cluster hash slot
(CRC-16/XMODEM of the name, mod 16384) in the shard's share of the slot space,
[shard·16384/shards, (shard+1)·16384/shards). Templates have no XOR, so the
CRC is table-driven with XOR from a 4-bit table. deploy/chart_test.go checks
the names against the code's for many layouts.
*/}}

{{/*
sluice.queueName: call with (dict "base" B "lane" L "shard" I "shards" N "t" TABLES)
where TABLES is the dict sluice.queueTriggers builds.
*/}}
{{- define "sluice.queueName" -}}
{{- $t := .t -}}
{{- $name := printf "%s.%s.%d" .base .lane (int .shard) -}}
{{- $lo := div (mul .shard 16384) .shards -}}
{{- $hi := div (mul (add .shard 1) 16384) .shards -}}
{{- $crc := 0 -}}
{{- range $c := splitList "" $name -}}
{{- $b := get $t.codes $c -}}
{{- $h := div $crc 256 -}}
{{- $v := index $t.crc (add (mul (index $t.x4 (add (mul (div $h 16) 16) (div $b 16))) 16) (index $t.x4 (add (mul (mod $h 16) 16) (mod $b 16)))) -}}
{{- $l := mod $crc 256 -}}{{- $vh := div $v 256 -}}
{{- $crc = add (mul (add (mul (index $t.x4 (add (mul (div $l 16) 16) (div $vh 16))) 16) (index $t.x4 (add (mul (mod $l 16) 16) (mod $vh 16)))) 256) (mod $v 256) -}}
{{- end -}}
{{- $q := $name -}}
{{- $slot := mod $crc 16384 -}}
{{- if or (lt $slot $lo) (ge $slot $hi) -}}
{{- $q = "" -}}
{{- range $c := list "-" -}}
{{- $b := get $t.codes $c -}}
{{- $h := div $crc 256 -}}
{{- $v := index $t.crc (add (mul (index $t.x4 (add (mul (div $h 16) 16) (div $b 16))) 16) (index $t.x4 (add (mul (mod $h 16) 16) (mod $b 16)))) -}}
{{- $l := mod $crc 256 -}}{{- $vh := div $v 256 -}}
{{- $crc = add (mul (add (mul (index $t.x4 (add (mul (div $l 16) 16) (div $vh 16))) 16) (index $t.x4 (add (mul (mod $l 16) 16) (mod $vh 16)))) 256) (mod $v 256) -}}
{{- end -}}
{{- $prefix := $crc -}}
{{- range $k := untilStep 1 4096 1 -}}
{{- $crc = $prefix -}}
{{- range $c := splitList "" (toString $k) -}}
{{- $b := get $t.codes $c -}}
{{- $h := div $crc 256 -}}
{{- $v := index $t.crc (add (mul (index $t.x4 (add (mul (div $h 16) 16) (div $b 16))) 16) (index $t.x4 (add (mul (mod $h 16) 16) (mod $b 16)))) -}}
{{- $l := mod $crc 256 -}}{{- $vh := div $v 256 -}}
{{- $crc = add (mul (add (mul (index $t.x4 (add (mul (div $l 16) 16) (div $vh 16))) 16) (index $t.x4 (add (mul (mod $l 16) 16) (mod $vh 16)))) 256) (mod $v 256) -}}
{{- end -}}
{{- $slot = mod $crc 16384 -}}
{{- if and (ge $slot $lo) (lt $slot $hi) -}}
{{- $q = printf "%s-%d" $name $k -}}
{{- break -}}
{{- end -}}
{{- end -}}
{{- if not $q -}}{{- fail (printf "no name for queue %s in its slot range" $name) -}}{{- end -}}
{{- end -}}
{{- $q -}}
{{- end -}}
