/* The mechanisms of the same-host data path compared (docs/same-host.md): memmove, process_vm_readv/writev
   into a child process, memmove into a mapped memfd, and a map+copy+unmap per transfer.
   Build and run: gcc -O2 -o /tmp/same_host_mech perf/same_host_mech.c && /tmp/same_host_mech */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>
#include <signal.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t sizes[]={65536,1<<20,16<<20};
  for(int si=0;si<3;si++){ size_t n=sizes[si]; int iters=(int)((2UL<<30)/n);
    char*src=aligned_alloc(4096,n),*dst=aligned_alloc(4096,n); memset(src,1,n);memset(dst,2,n);
    double t=now(); for(int i=0;i<iters;i++){memmove(dst,src,n); __asm__ volatile(""::"r"(dst):"memory");} double mm=now()-t;
    pid_t c=fork(); if(!c){pause();_exit(0);}
    usleep(10000);
    struct iovec l={dst,n}, r={src,n};
    t=now(); for(int i=0;i<iters;i++){ if(process_vm_readv(c,&l,1,&r,1,0)!=(ssize_t)n){perror("rv");return 1;}} double rv=now()-t;
    t=now(); for(int i=0;i<iters;i++){ if(process_vm_writev(c,&l,1,&r,1,0)!=(ssize_t)n){perror("wv");return 1;}} double wv=now()-t;
    kill(c,9);
    int fd=memfd_create("seg",0); ftruncate(fd,n); char*shm=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(shm,0,n);
    t=now(); for(int i=0;i<iters;i++){memmove(shm,src,n);__asm__ volatile(""::"r"(shm):"memory");} double sm=now()-t;
    t=now(); int it2=iters/8+1; for(int i=0;i<it2;i++){char*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memmove(dst,m,n); munmap(m,n);} double smap=(now()-t)/it2*iters;
    double gb=(double)n*iters/1e9;
    printf("%8zu B: memmove %.1f GB/s, vm_readv %.1f GB/s, vm_writev %.1f GB/s, memmove into memfd map %.1f GB/s, map+copy+unmap per op %.1f GB/s\n",n,gb/mm,gb/rv,gb/wv,gb/sm,gb/smap);
  }
}
